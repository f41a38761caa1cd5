package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
)

var errStopped = errors.New("wal: segment preparation stopped")

// preparedName is the file a prepared segment waits under, between runs
// too (never read as a segment: it has no segment name).
const preparedName = "next-segment.prepared"

// preparer creates the next segment file in the background: full size,
// allocated and filled with zeros, fsynced. Overwriting such a file costs an
// fsync no allocation or journal work, so appends into it are faster than
// appends that grow a file. The zeros read as "end of data" in recovery.
//
// A file once prepared is renamed to preparedName and kept when the log
// closes (or the process dies): the next Open adopts it instead of writing
// and fsyncing a segment's worth of zeros again while a restart is serving
// its restore.
type preparer struct {
	dir  string
	size int64
	ops  fileOps
	log  *slog.Logger

	mu        sync.Mutex
	ready     *os.File
	readyPath string
	n         int

	req     chan struct{}
	stop    chan struct{}
	done    chan struct{}
	started bool
}

// zeroFill is what a prepared segment is filled from. It is never written:
// its pages are the kernel's shared zero page, which no process's RSS counts
// (writing a file from all of it raised a test program's RssAnon by 76 kB; a
// heap buffer filled once, by 1 MiB). The preparer used to keep a 1 MiB heap
// buffer for the log's lifetime: half an idle supervisor's live heap.
var zeroFill [1 << 20]byte

func newPreparer(dir string, size int64, ops fileOps, log *slog.Logger) *preparer {
	return &preparer{dir: dir, size: size, ops: ops, log: log,
		req: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// run prepares a file each time one is requested and none is ready, until close.
func (p *preparer) run() {
	defer close(p.done)
	for {
		select {
		case <-p.stop:
			return
		case <-p.req:
		}
		p.mu.Lock()
		have := p.ready != nil
		p.mu.Unlock()
		if have {
			continue
		}
		f, path, err := p.prepare()
		if err != nil {
			if !errors.Is(err, errStopped) {
				p.log.Warn("could not prepare the next WAL segment; it will be created when needed and grow as written", "err", err)
			}
			continue
		}
		p.mu.Lock()
		p.ready, p.readyPath = f, path
		p.mu.Unlock()
	}
}

func (p *preparer) start() {
	p.started = true
	go p.run()
}

// request asks for a file to be prepared; it never blocks.
func (p *preparer) request() {
	select {
	case p.req <- struct{}{}:
	default:
	}
}

// take hands over the prepared file, if one is ready. The caller owns it and
// must rename or remove path.
func (p *preparer) take() (*os.File, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f, path := p.ready, p.readyPath
	p.ready, p.readyPath = nil, ""
	return f, path
}

// prepare creates one zero-filled file of the segment size under a unique
// temporary name. It can be called directly (for the first segment) or from run.
func (p *preparer) prepare() (f *os.File, path string, err error) {
	p.mu.Lock()
	p.n++
	path = filepath.Join(p.dir, fmt.Sprintf("prepare-%d%s", p.n, tmpSuffix))
	p.mu.Unlock()
	zeros := zeroFill[:]
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|noFollow, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("create %s: %w", path, err)
	}
	// The results are overwritten by each return below before this runs:
	// the file and its name are held apart.
	created, tmp := f, path
	defer func() {
		if err != nil {
			created.Close()
			os.Remove(tmp)
		}
	}()
	if err := fallocate(f, p.size); err != nil {
		return nil, "", fmt.Errorf("allocate %d bytes for %s: %w", p.size, path, err)
	}
	for off := int64(0); off < p.size; {
		select {
		case <-p.stop:
			return nil, "", errStopped
		default:
		}
		n := min(int64(len(zeros)), p.size-off)
		if _, err := p.ops.writeAt(f, zeros[:n], off); err != nil {
			return nil, "", fmt.Errorf("fill %s with zeros: %w", path, err)
		}
		off += n
	}
	if err := p.ops.datasync(f); err != nil {
		return nil, "", fmt.Errorf("fsync %s: %w", path, err)
	}
	// Whole and durable: kept under its waiting name from now on. The
	// rename needs no directory fsync: lost in a power cut, the file is a
	// leftover temporary file that recovery removes.
	kept := filepath.Join(p.dir, preparedName)
	if err := os.Rename(path, kept); err != nil {
		p.log.Debug("could not keep the prepared WAL segment under its waiting name; it is used once and not kept", "err", err)
		return f, path, nil
	}
	return f, kept, nil
}

// adopt makes the prepared file a previous run kept the ready one, if it is
// whole (the segment size; only prepare creates it, renamed there once
// zero-filled and fsynced). One of another size (the segment size changed)
// is removed.
func (p *preparer) adopt() {
	path := filepath.Join(p.dir, preparedName)
	f, err := os.OpenFile(path, os.O_RDWR|noFollow, 0)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			p.log.Warn("cannot open the WAL segment a previous run prepared; removing it", "err", err)
			os.Remove(path)
		}
		return
	}
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() || fi.Size() != p.size {
		f.Close()
		os.Remove(path)
		return
	}
	p.mu.Lock()
	if p.ready != nil {
		p.mu.Unlock()
		f.Close()
		return
	}
	p.ready, p.readyPath = f, path
	p.mu.Unlock()
}

// close stops the background work. An unused prepared file is kept for the
// next Open (adopt), unless it never got its waiting name.
func (p *preparer) close() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	if p.started {
		<-p.done
	}
	if f, path := p.take(); f != nil {
		f.Close()
		if filepath.Base(path) != preparedName {
			os.Remove(path)
		}
	}
}
