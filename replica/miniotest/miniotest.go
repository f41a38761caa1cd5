// Package miniotest runs a real MinIO server on loopback for tests of the
// replica: started by the test in a temporary directory, its port read back
// from its output, killed at cleanup.
//
// The binary comes from $SUPERVISOR_TEST_MINIO (.ci/minio.sh builds and
// prints it). Without it the tests skip, saying how to get it — except
// when $CI or SUPERVISOR_REQUIRE_MINIO=1 is set: then they fail.
package miniotest

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Credentials of every test server.
const (
	AccessKey = "supervisortest"
	SecretKey = "supervisortest-secret"
)

// Server is one running MinIO.
type Server struct {
	t        testing.TB
	bin, dir string
	Addr     string // host:port
	cmd      *exec.Cmd
	done     chan struct{}
	mu       sync.Mutex
	out      strings.Builder
}

// Binary returns the MinIO binary, or skips (fails under CI) t.
func Binary(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("SUPERVISOR_TEST_MINIO")
	if bin != "" {
		if _, err := os.Stat(bin); err == nil {
			return bin
		}
	}
	msg := "no MinIO server binary: run `export SUPERVISOR_TEST_MINIO=$(.ci/minio.sh)` (builds the pinned MinIO once, about 4 minutes)"
	if os.Getenv("CI") != "" || os.Getenv("SUPERVISOR_REQUIRE_MINIO") == "1" {
		t.Fatal(msg + " — required here (CI or SUPERVISOR_REQUIRE_MINIO=1)")
	}
	t.Skip(msg)
	return ""
}

// Start starts a server on a free loopback port with an empty directory.
func Start(t testing.TB) *Server {
	t.Helper()
	s := &Server{t: t, bin: Binary(t), dir: t.TempDir()}
	s.start("127.0.0.1:0")
	t.Cleanup(s.Stop)
	return s
}

var apiLine = regexp.MustCompile(`API: http://(127\.0\.0\.1:[0-9]+)`)

func (s *Server) start(addr string) {
	s.t.Helper()
	cmd := exec.Command(s.bin, "server", "--address", addr, filepath.Join(s.dir, "data"))
	cmd.Env = append(os.Environ(), "MINIO_ROOT_USER="+AccessKey, "MINIO_ROOT_PASSWORD="+SecretKey,
		"MINIO_BROWSER=off", "MINIO_UPDATE=off", "CI=") // CI=on makes MinIO verbose
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start MinIO: %v", err)
	}
	s.cmd, s.done = cmd, make(chan struct{})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			line := sc.Text()
			s.mu.Lock()
			if s.out.Len() < 64<<10 {
				s.out.WriteString(line + "\n")
			}
			s.mu.Unlock()
			if m := apiLine.FindStringSubmatch(line); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	go func() { _ = cmd.Wait(); pw.Close(); close(s.done) }()
	select {
	case a := <-found:
		s.Addr = a
	case <-s.done:
		s.t.Fatalf("MinIO exited at start:\n%s", s.output())
	case <-time.After(60 * time.Second):
		s.Stop()
		s.t.Fatalf("MinIO did not report its address within 60s:\n%s", s.output())
	}
	// Ready when it answers.
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := s.Client().ListBuckets(ctx)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("MinIO at %s not ready: %v\n%s", s.Addr, err, s.output())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (s *Server) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

// Endpoint is the server's URL, for --replica-endpoint.
func (s *Server) Endpoint() string { return "http://" + s.Addr }

// Dir is the server's storage directory (objects under Dir()/data/BUCKET).
func (s *Server) Dir() string { return filepath.Join(s.dir, "data") }

// Env is the environment a supervisor needs to reach the server.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_REGION=us-east-1"}
}

// Stop kills the server (a second Stop is harmless).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
	s.cmd = nil
}

// Restart starts the server again on the same address and directory.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	s.start(s.Addr)
}

// Client is an admin client.
func (s *Server) Client() *minio.Client {
	mc, err := minio.New(s.Addr, &minio.Options{Creds: credentials.NewStaticV4(AccessKey, SecretKey, ""), Region: "us-east-1"})
	if err != nil {
		s.t.Fatal(err)
	}
	return mc
}

// MakeBucket creates a bucket.
func (s *Server) MakeBucket(name string) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := s.Client().MakeBucket(ctx, name, minio.MakeBucketOptions{Region: "us-east-1"}); err != nil {
		s.t.Fatalf("make bucket %s: %v", name, err)
	}
}

// Keys lists the keys under prefix.
func (s *Server) Keys(bucket, prefix string) []string {
	s.t.Helper()
	var out []string
	for o := range s.Client().ListObjects(context.Background(), bucket, minio.ListObjectsOptions{Prefix: prefix, Recursive: true}) {
		if o.Err != nil {
			s.t.Fatalf("list %s/%s: %v", bucket, prefix, o.Err)
		}
		out = append(out, o.Key)
	}
	return out
}

// Put overwrites an object (a test corrupting the replica).
func (s *Server) Put(bucket, key string, b []byte) {
	s.t.Helper()
	_, err := s.Client().PutObject(context.Background(), bucket, key, strings.NewReader(string(b)), int64(len(b)), minio.PutObjectOptions{})
	if err != nil {
		s.t.Fatalf("put %s: %v", key, err)
	}
}

// Get reads an object.
func (s *Server) Get(bucket, key string) []byte {
	s.t.Helper()
	r, err := s.Client().GetObject(context.Background(), bucket, key, minio.GetObjectOptions{})
	if err != nil {
		s.t.Fatal(err)
	}
	defer r.Close()
	b, err := io.ReadAll(r)
	if err != nil {
		s.t.Fatalf("get %s: %v", key, err)
	}
	return b
}

func (s *Server) String() string { return fmt.Sprintf("MinIO at %s", s.Addr) }
