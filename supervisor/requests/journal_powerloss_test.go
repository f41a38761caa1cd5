package requests

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/agent-sidecar/supervisor/internal/crashfs"
)

// TestJournalPowerLoss runs the journal on a filesystem that keeps only
// what was fsynced (internal/crashfs; needs root and /dev/fuse) and cuts
// the power: every record whose ticket succeeded is there after the cut —
// the first ones of a journal just created, those written at Close, and
// those of a compacted journal and after it.
func TestJournalPowerLoss(t *testing.T) {
	if err := crashfs.Available(); err != nil {
		t.Skip(err)
	}
	base := t.TempDir()
	mnt, backing := filepath.Join(base, "mnt"), filepath.Join(base, "disk")
	for _, d := range []string{mnt, backing} {
		if err := os.Mkdir(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	var fs *crashfs.FS
	mount := func() {
		t.Helper()
		f, err := crashfs.Mount(mnt, backing, crashfs.Options{})
		if err != nil {
			t.Fatal(err)
		}
		fs = f
		t.Cleanup(func() { f.Close() })
	}
	// powerCut cuts the power with j open (as a machine crash leaves it),
	// then mounts what the disk kept and replays it.
	powerCut := func(j *Journal) *Replay {
		t.Helper()
		fs.Cut()
		j.Close() // after the cut: nothing more reaches the disk
		if err := fs.PowerOff(backing); err != nil {
			t.Fatal(err)
		}
		mount()
		return replayOf(t, filepath.Join(mnt, "data"))
	}
	// data/ is on the disk before the first mount: durable.
	if err := os.Mkdir(filepath.Join(backing, "data"), 0o700); err != nil {
		t.Fatal(err)
	}
	mount()
	data := filepath.Join(mnt, "data")

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
