package test

// Issue 31, items 2 and 3: a big state's restore and a restart on a long
// WAL tail, timed black-box against their floors measured in the same run.
// SUP_OLD and SUP_NEW name two supervisor binaries to alternate (old and
// new, one round each per iteration); without them the plain build runs.
//
//	go test -run X -bench 'BigStateRestore|RestartLongTail' -benchtime 5x ./test
//	SUP_OLD=/tmp/sup-base SUP_NEW=/tmp/sup-new go test -run X -bench ... ./test
//
// RestartLongTail drops the page cache before each cold round (as root:
// echo 3 > /proc/sys/vm/drop_caches); without root it runs warm only.

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// benchBins is the binaries to alternate: name → path.
func benchBins(b *testing.B) [][2]string {
	buildBoundsTools(b)
	if o, n := os.Getenv("SUP_OLD"), os.Getenv("SUP_NEW"); o != "" && n != "" {
		return [][2]string{{"old", o}, {"new", n}}
	}
	return [][2]string{{"this", plainBin}}
}

// bigStateOpts is startBigState's supervisor, in dataDir.
func bigStateOpts(bin, dir, dataDir string, size, entries int) supOpts {
	return supOpts{bin: bin, dataDir: dataDir, flags: []string{"--backoff-initial", "10ms"}, command: []string{hostilePath, "bigstate"},
		env: []string{"HOSTILE_OUT=" + filepath.Join(dir, "notes"), "HOSTILE_MARK=" + filepath.Join(dir, "mark"),
			"HOSTILE_SIZE=" + strconv.Itoa(size), "HOSTILE_ENTRIES=" + strconv.Itoa(entries), "HOSTILE_DISCARD=1"}}
}

// lastRestore parses the agent's last "restored" note: bytes of the frame
// and when its last byte was read.
func lastRestore(b testing.TB, notes string) (bytes int, at time.Time) {
	r := noted(notes, "restored ")
	f := strings.Fields(r[len(r)-1])
	n, _ := strconv.Atoi(f[7])
	ns, _ := strconv.ParseInt(f[9], 10, 64)
	return n, time.Unix(0, ns)
}

// pipeFloor is the best of three transfers of n bytes through a pipe, 1 MiB
// writes and reads, in a pipe of the default 64 KiB and in one of 1 MiB (the
// size the supervisor gives the agent's input pipe): the faster of the two.
func pipeFloor(b testing.TB, n int) time.Duration {
	best := time.Hour
	buf := make([]byte, 1<<20)
	for _, size := range []int{0, 1 << 20} {
		for range 3 {
			r, w, err := os.Pipe()
			if err != nil {
				b.Fatal(err)
			}
			if size > 0 {
				if rc, err := w.SyscallConn(); err == nil {
					rc.Control(func(fd uintptr) { unix.FcntlInt(fd, unix.F_SETPIPE_SZ, size) })
				}
			}
			done := make(chan struct{})
			go func() {
				defer close(done)
				rb := make([]byte, 1<<20)
				for got := 0; got < n; {
					m, err := r.Read(rb)
					if err != nil {
						return
					}
					got += m
				}
			}()
			start := time.Now()
			for left := n; left > 0; left -= min(left, len(buf)) {
				w.Write(buf[:min(left, len(buf))])
			}
			<-done
			best = min(best, time.Since(start))
			r.Close()
			w.Close()
		}
	}
	return best
}

// readDecompressFloor is the best of three reads and decompressions of the
// checkpoint files under dataDir.
func readDecompressFloor(b testing.TB, dataDir string) time.Duration {
	files, _ := filepath.Glob(filepath.Join(dataDir, "checkpoints", "*.ckpt"))
	best := time.Hour
	for range 3 {
		start := time.Now()
		for _, p := range files {
			f, err := os.Open(p)
			if err != nil {
				b.Fatal(err)
			}
			f.Seek(68, io.SeekStart)
			dec, err := zstd.NewReader(f)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := dec.WriteTo(io.Discard); err != nil {
				b.Fatal(err)
			}
			dec.Close()
			f.Close()
		}
		best = min(best, time.Since(start))
	}
	return best
}

// readFloor is the best of three reads of the WAL's segment files (what
// holds the tail), and their bytes.
func readFloor(b testing.TB, dataDir string) (time.Duration, int64) {
	files, _ := filepath.Glob(filepath.Join(dataDir, "wal", "*"))
	best, total := time.Hour, int64(0)
	buf := make([]byte, 1<<20)
	for range 3 {
		total = 0
		start := time.Now()
		for _, p := range files {
			f, err := os.Open(p)
			if err != nil {
				continue
			}
			for {
				n, err := f.Read(buf)
				total += int64(n)
				if err != nil {
					break
				}
			}
			f.Close()
		}
		best = min(best, time.Since(start))
	}
	return best, total
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

// An agent with a 100 MB state (a 100 MB checkpoint of text and float32
// embeddings, then 10,000 entries of 1 KiB) is killed: death → the last
// byte of its restore read, against read + decompress of the checkpoint
// file + one pipe transfer of the restore. Target ≤ 1.5×.
func BenchmarkBigStateRestore(b *testing.B) {
	type run struct {
		name  string
		s     *hostileRun
		lat   []time.Duration
		floor []time.Duration
	}
	var runs []*run
	for _, bin := range benchBins(b) {
		dir := b.TempDir()
		o := bigStateOpts(bin[1], dir, filepath.Join(dir, "data"), 100_000_000, 10000)
		// Each round is one death of a healthy agent. Rounds come faster
		// than --backoff's healthy reset (10 s), so without a cap the
		// restart delay would double round after round (10, 20, 40, 80 ms…)
		// and the later rounds would time the crash-loop back-off (and
		// --max-restarts would give up).
		o.flags = append(o.flags, "--backoff-max", "10ms", "--max-restarts", "0")
		h := &hostileRun{sup: startSup(b, o), notes: filepath.Join(dir, "notes")}
		waitFor(b, 5*time.Minute, "checkpoint and entries acknowledged", func() bool {
			return len(noted(h.notes, "ack ")) == 1 && len(noted(h.notes, "walack 10000")) == 1
		})
		runs = append(runs, &run{name: bin[0], s: h})
	}
	b.ResetTimer()
	for range b.N {
		for _, r := range runs {
			n := len(noted(r.s.notes, "restored "))
			pid := notedPID(b, r.s.notes)
			t0 := time.Now()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				b.Fatal(err)
			}
			waitFor(b, 2*time.Minute, "the restore read", func() bool { return len(noted(r.s.notes, "restored ")) == n+1 })
			size, at := lastRestore(b, r.s.notes)
			lat := at.Sub(t0)
			floor := readDecompressFloor(b, r.s.dataDir) + pipeFloor(b, size)
			r.lat, r.floor = append(r.lat, lat), append(r.floor, floor)
			b.Logf("%s: death → restore read %v; floor %v (restore %d bytes): %.2f×", r.name, lat.Round(time.Millisecond),
				floor.Round(time.Millisecond), size, float64(lat)/float64(floor))
		}
	}
	b.StopTimer()
	for _, r := range runs {
		b.ReportMetric(float64(median(r.lat))/1e6, r.name+"-ms/restore")
		b.ReportMetric(float64(median(r.lat))/float64(median(r.floor)), r.name+"-x-floor")
	}
}

var walOpenedRE = regexp.MustCompile(`msg="WAL opened".* open_seconds=([0-9.e-]+)`)

// The supervisor is killed with SIGKILL and started again on a WAL tail of
// 110,000 entries of 1 KiB above a small checkpoint: exec → the last byte
// of the restore read, against a read of the tail's bytes + one pipe
// transfer of the restore. Target ≤ 2×. Warm rounds, and cold ones (page
// cache dropped) when run as root; the recovery scan rate (the WAL's bytes
// over the time the stores took to open, from the "WAL opened" log line)
// is reported beside the segment files' sequential read rate. With
// RESTART_EARLY=1 the newest binary runs a second time with
// --spawn-during-recovery ("+early"), alternated with the others. With
// RESTART_AGENT=python the restarts run a Python agent that imports the
// client package and times its restore (testdata/restore_reader.py), the
// start-up that --spawn-during-recovery overlaps with the recovery.
func BenchmarkRestartLongTail(b *testing.B) {
	type run struct {
		name, dir, dataDir string
		opts               supOpts
		s                  *sup
	}
	var runs []*run
	bins := benchBins(b)
	if os.Getenv("RESTART_EARLY") == "1" {
		last := bins[len(bins)-1]
		bins = append(bins, [2]string{last[0] + "+early", last[1]})
	}
	for _, bin := range bins {
		dir := b.TempDir()
		r := &run{name: bin[0], dir: dir, dataDir: filepath.Join(dir, "data")}
		r.opts = bigStateOpts(bin[1], dir, r.dataDir, 200_000, 110000)
		if strings.HasSuffix(bin[0], "+early") {
			r.opts.flags = append(r.opts.flags, "--spawn-during-recovery")
		}
		r.s = startSup(b, r.opts)
		notes := filepath.Join(dir, "notes")
		waitFor(b, 5*time.Minute, "checkpoint and entries acknowledged", func() bool {
			return len(noted(notes, "ack ")) == 1 && len(noted(notes, "walack 110000")) == 1
		})
		if os.Getenv("RESTART_AGENT") == "python" {
			reader, _ := filepath.Abs("testdata/restore_reader.py")
			pkg, _ := filepath.Abs("../python")
			r.opts.command = []string{"/usr/bin/python3", reader}
			r.opts.env = append(r.opts.env, "PYTHONPATH="+pkg)
		}
		runs = append(runs, r)
	}
	canDrop := os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0) == nil
	b.ResetTimer()
	for range b.N {
		for _, cold := range []bool{false, true} {
			if cold && !canDrop {
				continue
			}
			for _, r := range runs {
				notes := filepath.Join(r.dir, "notes")
				n := len(noted(notes, "restored "))
				r.s.cmd.Process.Kill()
				<-r.s.done
				time.Sleep(50 * time.Millisecond) // the orphaned agent sees its input end and exits
				var floor time.Duration
				var walBytes int64
				if cold {
					os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
					start := time.Now()
					_, walBytes = readFloor(b, r.dataDir) // one cold read (best of three is warm after the first)
					floor = time.Since(start)
					os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0)
				} else {
					floor, walBytes = readFloor(b, r.dataDir)
				}
				t0 := time.Now()
				r.s = startSup(b, r.opts)
				waitFor(b, 2*time.Minute, "the restore read", func() bool { return len(noted(notes, "restored ")) == n+1 })
				size, at := lastRestore(b, notes)
				lat := at.Sub(t0)
				pipe := pipeFloor(b, size)
				scan := "?"
				if m := walOpenedRE.FindStringSubmatch(r.s.out.String()); m != nil {
					if sec, err := strconv.ParseFloat(m[1], 64); err == nil && sec > 0 {
						scan = fmt.Sprintf("%.0f MB/s", float64(walBytes)/sec/1e6)
					}
				}
				b.Logf("%s %s: exec → restore read %v; floor %v (read %d B: %v, %.0f MB/s; pipe %d B: %v): %.2f×; recovery scan %s",
					r.name, map[bool]string{true: "cold", false: "warm"}[cold], lat.Round(time.Millisecond), (floor + pipe).Round(time.Millisecond),
					walBytes, floor.Round(time.Millisecond), float64(walBytes)/floor.Seconds()/1e6, size, pipe.Round(time.Millisecond),
					float64(lat)/float64(floor+pipe), scan)
			}
		}
	}
}
