package checkpoint

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"runtime"
	"slices"

	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// Staged is a checkpoint compressed into a temporary file as its bytes
// arrive (from the agent's pipe), before it is known whether it will be
// kept: [Store.Stage] begins one, Write feeds it, and Commit stores it (an
// id, the header, fsync, rename, fsync of the directory) or Abort throws it
// away. Neither the checkpoint nor its compressed form is ever held: the
// encoder keeps its 1 MiB window and a block or two. Write is called by one
// goroutine; Commit or Abort, once, may be called by another after it.
//
// The stored zstd frame does not declare its content size (it is not known
// when the frame begins): [Store.LoadCompressed] answers ErrNoContentSize
// for it, and a restore sends it decompressed ([Store.WriteData]).
type Staged struct {
	s   *Store
	tmp *atomicfile.Temp
	cw  countingWriter
	enc *zstd.Encoder
	sum summingWriter
	err error // sticky: the first write or compression failure
	end bool  // Commit or Abort was called
}

// Stage begins a checkpoint whose bytes are written to the returned Staged.
func (s *Store) Stage() (*Staged, error) {
	tmp, err := atomicfile.CreateTemp(s.dir, "staged")
	if err != nil {
		return nil, fmt.Errorf("checkpoint: stage in %s: %w", s.dir, err)
	}
	if _, err := tmp.F.Seek(headerLen, io.SeekStart); err != nil {
		tmp.Abort()
		return nil, fmt.Errorf("checkpoint: stage in %s: %w", s.dir, err)
	}
	st := &Staged{s: s, tmp: tmp}
	st.cw.w = tmp.F
	// The next block is compressed while the last is written (see compress:
	// no per-job copies of the input).
	st.enc, err = zstd.NewWriter(&st.cw,
		zstd.WithEncoderLevel(s.opts.Level),
		zstd.WithWindowSize(encoderWindow),
		zstd.WithEncoderConcurrency(runtime.GOMAXPROCS(0)),
		zstd.WithConcurrentBlocks(false),
		zstd.WithEncoderCRC(true))
	if err != nil {
		tmp.Abort()
		return nil, fmt.Errorf("checkpoint: compress: %w", err)
	}
	st.sum = summingWriter{w: st.enc, max: s.opts.MaxSize}
	return st, nil
}

// Write compresses p into the temporary file. Past Options.MaxSize it fails
// with an error wrapping ErrTooLarge. An error is sticky: the checkpoint can
// then only be aborted.
func (st *Staged) Write(p []byte) (int, error) {
	if st.err != nil {
		return 0, st.err
	}
	n, err := st.sum.Write(p)
	if err != nil {
		st.err = fmt.Errorf("checkpoint: stage: %w", err)
		return n, st.err
	}
	return n, nil
}

// Size is the uncompressed bytes written so far.
func (st *Staged) Size() int64 { return st.sum.n }

// Abort removes the temporary file. It may follow a failed Commit.
func (st *Staged) Abort() {
	if st.end {
		return
	}
	st.end = true
	st.enc.Close()
	st.tmp.Abort()
}

// Commit stores the checkpoint with the given WAL watermark: its id and
// creation time are taken now (ids grow in the order checkpoints become
// visible, as for Save), and it returns once the file and its directory
// entry are on disk. On an error nothing is stored (a failure after the
// rename takes the file back, as Save does).
func (st *Staged) Commit(watermark uint64) (Meta, error) {
	if st.end {
		return Meta{}, errors.New("checkpoint: staged checkpoint committed or aborted twice")
	}
	if st.err != nil {
		st.Abort()
		return Meta{}, st.err
	}
	if err := st.enc.Close(); err != nil {
		st.end = true
		st.tmp.Abort()
		return Meta{}, fmt.Errorf("checkpoint: compress: %w", err)
	}
	st.end = true
	s := st.s
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	u, now, err := s.newID()
	if err != nil {
		st.tmp.Abort()
		return Meta{}, err
	}
	h := header{id: u, created: now.UTC().Round(0), watermark: watermark,
		size: uint64(st.sum.n), crc: st.sum.crc, bodyLen: uint64(st.cw.n)}
	id := u.String()
	if _, err := st.tmp.F.WriteAt(h.marshal(), 0); err != nil {
		st.tmp.Abort()
		return Meta{}, s.saveFailed(u, id, err)
	}
	stored, err := st.tmp.Commit(fileName(id))
	if err != nil {
		return Meta{}, s.saveFailed(u, id, err)
	}
	s.lastID, s.haveLast = u, true
	return Meta{ID: id, Created: h.created, Watermark: watermark, Size: int64(h.size), StoredSize: stored, Checksum: h.checksum()}, nil
}

// WriteData writes checkpoint id's data to w as it decompresses — the
// exact bytes given to Save, never held whole: the decoder keeps its window
// and decodes ahead of w on its own goroutines — checking as it goes that it
// decompresses to exactly the header's size with the header's checksum.
// That is only known at the end: on ErrCorrupt (or a read error), w has
// received a prefix, possibly of wrong bytes, and its user must treat what
// it got as void (a restore cuts its frame short). It returns the header's
// metadata. Errors wrap ErrInvalidID, ErrNotFound or ErrCorrupt; an error
// from w is returned as it is.
func (s *Store) WriteData(id string, w io.Writer) (Meta, error) {
	id, err := ParseID(id)
	if err != nil {
		return Meta{}, err
	}
	f, e, h, err := s.openReadable(id)
	if err != nil {
		return e.Meta, err
	}
	defer f.Close()
	dec, err := zstd.NewReader(io.NewSectionReader(f, headerLen, int64(h.bodyLen)),
		// One goroutine: a concurrent decoder hands every block between
		// its goroutines, and on a small VM those wake-ups cost more than
		// they overlap (a 100 MB restore: 174–201 ms at 2, 131–155 at 1,
		// BenchmarkBigStateRestore). The overlap that pays is with the
		// pipe's writes (wire.WriteFrameStream's ring).
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(decoderWindowFloor),
		zstd.WithDecoderMaxWindow(decoderWindowFloor))
	if err != nil {
		return e.Meta, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	defer dec.Close()
	cw := &checkWriter{w: w, left: int64(h.size), crc: crc32.New(castagnoli)}
	if _, err := dec.WriteTo(cw); err != nil {
		if cw.werr != nil {
			return e.Meta, cw.werr
		}
		return e.Meta, fmt.Errorf("checkpoint %s: %w: decompress: %w", id, ErrCorrupt, err)
	}
	if cw.left != 0 {
		return e.Meta, fmt.Errorf("checkpoint %s: %w: body decompresses to %d bytes, the header claims %d", id, ErrCorrupt, int64(h.size)-cw.left, h.size)
	}
	if got := cw.crc.Sum32(); got != h.crc {
		return e.Meta, fmt.Errorf("checkpoint %s: %w: checksum mismatch: header %08x, data %08x", id, ErrCorrupt, h.crc, got)
	}
	return e.Meta, nil
}

// errOverSize: the body decompresses to more than its header claims.
var errOverSize = errors.New("body decompresses to more than the header claims")

// checkWriter passes at most left bytes to w, checksumming them; a write
// error of w is kept apart.
type checkWriter struct {
	w    io.Writer
	left int64
	crc  hash32
	werr error
}

type hash32 interface {
	io.Writer
	Sum32() uint32
}

func (c *checkWriter) Write(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		return 0, errOverSize
	}
	c.crc.Write(p)
	n, err := c.w.Write(p)
	c.left -= int64(n)
	if err != nil {
		c.werr = err
	}
	return n, err
}

// Candidates lists the checkpoints a restore may use, newest first — those
// older than olderThan when it is set (the crash-loop fallback; it must be
// in the store) — by their headers alone, and the ones passed over and why
// (marked bad, or a header that does not read), as Latest and Previous
// report them. The bodies are not read: whoever uses one verifies it
// (Load, WriteData).
func (s *Store) Candidates(olderThan string) ([]Meta, []Skipped, error) {
	es, err := s.list()
	if err != nil {
		return nil, nil, err
	}
	if olderThan != "" {
		id, err := ParseID(olderThan)
		if err != nil {
			return nil, nil, err
		}
		i := slices.IndexFunc(es, func(e entry) bool { return e.ID == id })
		if i < 0 {
			return nil, nil, fmt.Errorf("%w: checkpoint %s", ErrNotFound, id)
		}
		es = es[i+1:]
	}
	var good []Meta
	var skipped []Skipped
	for _, e := range es {
		switch {
		case e.Bad && e.err == nil:
			skipped = append(skipped, Skipped{ID: e.ID, Err: fmt.Errorf("%w: %s", ErrMarkedBad, e.BadReason)})
		case e.err != nil:
			skipped = append(skipped, Skipped{ID: e.ID, Err: e.err})
		default:
			good = append(good, e.Meta)
		}
	}
	return good, skipped, nil
}
