package requests

import (
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/agent-sidecar/supervisor/internal/crashfs"
)

// crashDisk is a crashfs mount for a journal test, its data directory
// made durable before the first mount.
type crashDisk struct {
	t            *testing.T
	mnt, backing string
	data         string // the data directory on the mount
	fs           *crashfs.FS
}

func newCrashDisk(t *testing.T, opts crashfs.Options) *crashDisk {
	t.Helper()
	if err := crashfs.Available(); err != nil {
		t.Skip(err)
	}
	base := t.TempDir()
	d := &crashDisk{t: t, mnt: filepath.Join(base, "mnt"), backing: filepath.Join(base, "disk")}
	d.data = filepath.Join(d.mnt, "data")
	for _, dir := range []string{d.mnt, d.backing, filepath.Join(d.backing, "data")} {
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	d.mount(opts)
	return d
}

func (d *crashDisk) mount(opts crashfs.Options) {
	d.t.Helper()
	f, err := crashfs.Mount(d.mnt, d.backing, opts)
	if err != nil {
		d.t.Fatal(err)
	}
	d.fs = f
	d.t.Cleanup(func() { f.Close() })
}

// powerCut cuts the power with j open (as a machine crash leaves it),
// then mounts what the disk kept, without faults, and replays it.
func (d *crashDisk) powerCut(j *Journal) *Replay {
	d.t.Helper()
	d.fs.Cut()
	j.Close() // after the cut: nothing more reaches the disk
	if err := d.fs.PowerOff(d.backing); err != nil {
		d.t.Fatal(err)
	}
	d.mount(crashfs.Options{})
	return replayOf(d.t, d.data)
}

// TestJournalPowerLoss runs the journal on a filesystem that keeps only
// what was fsynced (internal/crashfs; needs root and /dev/fuse) and cuts
// the power: every record whose ticket succeeded is there after the cut —
// the first ones of a journal just created, those written at Close, and
// those of a compacted journal and after it.
func TestJournalPowerLoss(t *testing.T) {
	d := newCrashDisk(t, crashfs.Options{})
	data, powerCut := d.data, d.powerCut

	// A journal created, one record acknowledged, the power cut.
	j, _, err := Open(data)
	if err != nil {
		t.Fatal(err)
	}
	var book []*Record // what a compaction writes: every record so far
	j.Start(func() []*Record { return slices.Clone(book) }, nil)
	book = append(book, accepted("a"))
	if err := j.Append(accepted("a")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := recordIDs(powerCut(j)); !slices.Equal(got, []string{"a"}) {
		t.Fatalf("after a cut with a new journal's first record acknowledged: %v, want [a]", got)
	}

	// Records written at Close (a lazy one among them), then the cut.
	j, _, err = Open(data)
	if err != nil {
		t.Fatal(err)
	}
	j.Start(func() []*Record { return slices.Clone(book) }, nil)
	book = append(book, accepted("b"), accepted("c"))
	j.AppendLazy(accepted("b"))
	j.Append(accepted("c"))
	if err := j.Close(); err != nil {
		t.Fatal(err)
	}
	if got := recordIDs(powerCut(j)); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Fatalf("after a cut that followed Close: %v, want [a b c]", got)
	}

	// A compaction that drops b (as the book drops a request it no longer
	// keeps), a record after it, the cut: the compacted journal, then d.
	j, _, err = Open(data)
	if err != nil {
		t.Fatal(err)
	}
	asked := make(chan struct{})
	j.Start(func() []*Record { close(asked); return []*Record{book[0], book[2]} }, nil)
	j.Compact()
	<-asked
	// The writer is compacting: d is written after the compaction.
	if err := j.Append(accepted("d")).Wait(); err != nil {
		t.Fatal(err)
	}
	if got := recordIDs(powerCut(j)); !slices.Equal(got, []string{"a", "c", "d"}) {
		t.Fatalf("after a cut that followed a compaction: %v, want [a c d]", got)
	}
}

// TestJournalCompactionRenameNotDurable: a compaction whose rename is done
// but whose directory fsync fails (atomicfile.ErrNotDurable) leaves the new
// journal in use under a name a power cut may take back to the old file.
// A record written after it is acknowledged only once the directory is
// fsynced: after the cut the compacted journal and that record are there;
// while the directory cannot be fsynced, its ticket fails instead.
func TestJournalCompactionRenameNotDurable(t *testing.T) {
	for _, tc := range []struct {
		name     string
		failures int // directory fsyncs of requests/ that fail from the compaction's on
	}{{"the next directory fsync succeeds", 1}, {"the directory cannot be fsynced", 1 << 30}} {
		t.Run(tc.name, func(t *testing.T) {
			var armed atomic.Bool
			var failed atomic.Int32
			d := newCrashDisk(t, crashfs.Options{FailFsync: func(c crashfs.Fsync) bool {
				if c.Dir && c.Path == "data/"+DirName && armed.Load() && failed.Load() < int32(tc.failures) {
					failed.Add(1)
					return true
				}
				return false
			}})
			j, _, err := Open(d.data)
			if err != nil {
				t.Fatal(err)
			}
			asked := make(chan struct{})
			j.Start(func() []*Record {
				close(asked)
				return []*Record{accepted("a")} // b is no longer kept
			}, nil)
			if err := j.Append(accepted("a"), accepted("b")).Wait(); err != nil {
				t.Fatal(err)
			}
			armed.Store(true)
			j.Compact()
			<-asked
			err = j.Append(accepted("c")).Wait() // written after the compaction
			if failed.Load() == 0 {
				t.Fatal("no directory fsync failed: the test did not test anything")
			}
			rp := d.powerCut(j)
			got := recordIDs(rp)
			if tc.failures == 1 {
				if err != nil {
					t.Fatalf("c, written once the directory fsync worked again: %v", err)
				}
				if !slices.Equal(got, []string{"a", "c"}) {
					t.Fatalf("after the cut: %v, want the compacted journal and c, [a c]", got)
				}
				return
			}
			if err == nil {
				t.Fatalf("c was acknowledged while the compacted journal's name could not be made durable; after the cut: %v", got)
			}
			if !slices.Equal(got, []string{"a", "b"}) && !slices.Equal(got, []string{"a"}) {
				t.Fatalf("after the cut: %v, want the journal before or after the compaction, without c", got)
			}
		})
	}
}
