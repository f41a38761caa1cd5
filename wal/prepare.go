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

// preparer creates the next segment file in the background: full size,
// allocated and filled with zeros, fsynced. Overwriting such a file costs an
// fsync no allocation or journal work, so appends into it are faster than
// appends that grow a file. The zeros read as "end of data" in recovery.
type preparer struct {
	dir  string
	size int64
	ops  fileOps
	log  *slog.Logger

	mu        sync.Mutex
	ready     *os.File
	readyPath string
	n         int
	zeros     []byte

	req     chan struct{}
	stop    chan struct{}
	done    chan struct{}
	started bool
}

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
	if p.zeros == nil {
		p.zeros = make([]byte, 1<<20)
	}
	zeros := p.zeros
	p.mu.Unlock()
	f, err = os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC|noFollow, 0o600)
	if err != nil {
		return nil, "", fmt.Errorf("create %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(path)
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
	return f, path, nil
}

// close stops the background work and removes an unused prepared file.
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
		os.Remove(path)
	}
}
