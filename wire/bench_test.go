package wire_test

import (
	"fmt"
	"io"
	"os"
	"testing"

	"github.com/agent-sidecar/supervisor/wire"
)

// BenchmarkPipeFrames writes frames from one goroutine and reads them in
// another over a real os.Pipe, as the supervisor and its agent do.
func BenchmarkPipeFrames(b *testing.B) {
	for _, size := range []int{64, 1 << 10, 64 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("%dB", size), func(b *testing.B) {
			pr, pw, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			defer pr.Close()
			payload := make([]byte, size)
			b.ReportAllocs()
			b.SetBytes(int64(size + wire.HeaderSize))
			b.ResetTimer()
			errc := make(chan error, 1)
			go func() {
				w := wire.NewWriter(pw, 0)
				for range b.N {
					if err := w.WriteFrame(payload); err != nil {
						errc <- err
						pw.Close()
						return
					}
				}
				errc <- pw.Close()
			}()
			r := wire.NewReader(pr, 0)
			for {
				_, err := r.ReadFrame()
				if err == io.EOF {
					break
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			if err := <-errc; err != nil {
				b.Fatal(err)
			}
		})
	}
}
