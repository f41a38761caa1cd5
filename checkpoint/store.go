package checkpoint

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/klauspost/compress/zstd"

	"github.com/agent-sidecar/supervisor/internal/atomicfile"
)

// Errors callers branch on. Every error the store returns for one of these
// conditions wraps the sentinel, so test with [errors.Is].
var (
	// ErrNotFound: no checkpoint with that id, or none at all.
	ErrNotFound = errors.New("checkpoint: not found")
	// ErrCorrupt: the file is not an intact checkpoint (bad header, truncated,
	// decompression failed, checksum mismatch). The data is not returned.
	ErrCorrupt = errors.New("checkpoint: corrupt")
	// ErrInvalidID: the id is not a UUID.
	ErrInvalidID = errors.New("checkpoint: invalid id")
	// ErrTooLarge: the data exceeds Options.MaxSize (on Save), or a header
	// claims more than it (on Load, together with ErrCorrupt).
	ErrTooLarge = errors.New("checkpoint: too large")
	// ErrMarkedBad: reported in [Skipped] for a checkpoint that was marked bad
	// with [Store.MarkBad]; the store never fails an operation with it.
	ErrMarkedBad = errors.New("checkpoint: marked bad")
)

// Defaults for zero [Options] fields.
const (
	DefaultRetain  = 5
	DefaultLevel   = zstd.SpeedFastest
	DefaultMaxSize = 100<<20 + 1<<20
)

const (
	ckptSuffix = ".ckpt"
	pinSuffix  = ".pin"
	badSuffix  = ".bad"

	// concurrentThreshold is the size from which Save compresses with
	// parallel jobs rather than in one goroutine.
	concurrentThreshold = 4 << 20
	// encoderWindow is the zstd window Save uses.
	encoderWindow = 1 << 20
	// decoderWindowFloor is the largest window Load accepts for a small
	// checkpoint (for a large one, its size): 8 MiB, what zstd recommends
	// every decoder support.
	decoderWindowFloor = 8 << 20
	// maxMarker bounds the marker files read from disk.
	maxMarker = 64 << 10
	// maxBadReason bounds the reason kept in a bad mark.
	maxBadReason = 4 << 10
)

// Options configure a [Store]. Zero fields get defaults.
type Options struct {
	// Retain is how many good checkpoints Prune keeps (pinned ones are kept
	// in addition). Zero or negative means DefaultRetain (5).
	Retain int
	// Level is the zstd level for Save. Zero means DefaultLevel
	// (zstd.SpeedFastest), the fastest by a third for 4% more bytes on
	// realistic checkpoints; the package documentation has the figures.
	Level zstd.EncoderLevel
	// MaxSize is the largest uncompressed checkpoint accepted, by Save and
	// by Load (a header claiming more is corrupt). Zero means DefaultMaxSize
	// (101 MiB).
	MaxSize int64
	// Logger receives what the store does on its own (stale temporary files
	// removed, checkpoints pruned). Nil discards.
	Logger *slog.Logger
	// Now is the clock for creation times and new ids; nil means time.Now.
	// Ordering never depends on it (see order.go).
	Now func() time.Time
}

// Meta describes a stored checkpoint. It is read from the file's header and
// the marker files beside it.
type Meta struct {
	ID         string    `json:"id"`          // canonical UUID string
	Created    time.Time `json:"created"`     // when Save stored it
	Watermark  uint64    `json:"watermark"`   // highest WAL sequence appended before the checkpoint arrived
	Size       int64     `json:"size"`        // uncompressed bytes
	StoredSize int64     `json:"stored_size"` // bytes on disk (the file)
	Checksum   string    `json:"checksum"`    // "crc32c:xxxxxxxx", over the uncompressed data
	Pinned     bool      `json:"pinned"`
	Bad        bool      `json:"bad"`
	BadReason  string    `json:"bad_reason,omitempty"`
}

// Skipped is a checkpoint [Store.Latest] or [Store.Previous] passed over, and
// why: Err wraps ErrMarkedBad, ErrCorrupt, or the I/O error that kept it from
// being read.
type Skipped struct {
	ID  string
	Err error
}

// Store is a directory of checkpoints. Its methods are safe for concurrent
// use; List, Stat and Load may also run in other processes while one
// process writes.
type Store struct {
	dir  string
	opts Options
	log  *slog.Logger

	// saveMu serialises Saves, bounding the CPU and memory they take. A Save
	// needs nothing else: its file is invisible until renamed to a new name.
	saveMu   sync.Mutex
	lastID   uuid.UUID // the greatest id in the store (saveMu); ids only grow
	haveLast bool
	// mu serialises the other writes (Pin, Unpin, MarkBad, Prune, the
	// restore point), which must not interleave with one another.
	mu sync.Mutex

	// ignored holds the names of checkpoint files already logged as ignored
	// (a symlink, not a regular file): each is logged once per Store.
	ignoredMu sync.Mutex
	ignored   map[string]bool
}

// Open opens the store in dir, creating the directory (mode 0700) if needed,
// and removes temporary files left by a writer that crashed (temporary files
// a live writer holds are left alone).
func Open(dir string, opts Options) (*Store, error) {
	if opts.Retain <= 0 {
		opts.Retain = DefaultRetain
	}
	if opts.Level == 0 {
		opts.Level = DefaultLevel
	}
	if opts.Level < zstd.SpeedFastest || opts.Level > zstd.SpeedBestCompression {
		return nil, fmt.Errorf("checkpoint: unknown zstd level %d", opts.Level)
	}
	if opts.MaxSize <= 0 {
		opts.MaxSize = DefaultMaxSize
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if err := atomicfile.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("checkpoint: create store directory: %w", err)
	}
	s := &Store{dir: dir, opts: opts, log: opts.Logger}
	removed, err := atomicfile.Sweep(dir, "")
	for _, name := range removed {
		s.log.Warn("removed temporary file left by an interrupted write", "file", name)
	}
	if err != nil {
		// Leftovers waste space but hurt nothing: readers ignore them.
		s.log.Warn("could not remove stale temporary files", "dir", dir, "err", err)
	}
	return s, nil
}

// Dir returns the store's directory.
func (s *Store) Dir() string { return s.dir }

// Save compresses data and stores it as a new checkpoint with the given WAL
// watermark. It returns only once the file and its directory entry are on
// disk; nothing partial is ever visible under the checkpoint's name. Data
// over Options.MaxSize returns an error wrapping ErrTooLarge. Save does not
// prune; call [Store.Prune] after.
func (s *Store) Save(data []byte, watermark uint64) (Meta, error) {
	if int64(len(data)) > s.opts.MaxSize {
		return Meta{}, fmt.Errorf("%w: checkpoint of %d bytes, limit %d", ErrTooLarge, len(data), s.opts.MaxSize)
	}
	crc := crc32.Checksum(data, castagnoli)

	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	// The id and time are taken under the lock, so that creation order is
	// the order in which checkpoints become visible.
	u, now, err := s.newID()
	if err != nil {
		return Meta{}, err
	}
	h := header{
		id:        u,
		created:   now.UTC().Round(0),
		watermark: watermark,
		size:      uint64(len(data)),
		crc:       crc,
	}
	id := u.String()
	stored, err := atomicfile.Write(s.dir, fileName(id), func(f *os.File) error {
		if _, err := f.Seek(headerLen, io.SeekStart); err != nil {
			return err
		}
		cw := &countingWriter{w: f}
		if err := s.compress(cw, data); err != nil {
			return err
		}
		h.bodyLen = uint64(cw.n)
		_, err := f.WriteAt(h.marshal(), 0)
		return err
	})
	if err != nil {
		return Meta{}, s.saveFailed(u, id, err)
	}
	s.lastID, s.haveLast = u, true
	return Meta{
		ID:         id,
		Created:    h.created,
		Watermark:  watermark,
		Size:       int64(h.size),
		StoredSize: stored,
		Checksum:   h.checksum(),
	}, nil
}

// SaveStream stores a new checkpoint whose uncompressed bytes fill writes,
// compressing them as they come: the whole checkpoint is never held in
// memory (the encoder keeps a 1 MiB window). The size and checksum are
// counted on the way. If fill returns an error, or writes more than
// Options.MaxSize bytes (an error wrapping ErrTooLarge), nothing is stored
// and the error is returned as it is. Otherwise it is Save.
func (s *Store) SaveStream(watermark uint64, fill func(w io.Writer) error) (Meta, error) {
	return s.SaveStreamSized(watermark, -1, fill)
}

// SaveStreamSized is SaveStream for a checkpoint whose size is known in
// advance (-1: unknown): the stored zstd frame then declares its content
// size, which one-shot decoders in other languages need, so that
// [Store.LoadCompressed] can hand it to an agent as it is. fill writing any
// other number of bytes is an error.
func (s *Store) SaveStreamSized(watermark uint64, size int64, fill func(w io.Writer) error) (Meta, error) {
	s.saveMu.Lock()
	defer s.saveMu.Unlock()
	u, now, err := s.newID()
	if err != nil {
		return Meta{}, err
	}
	h := header{id: u, created: now.UTC().Round(0), watermark: watermark}
	id := u.String()
	var fillErr error
	stored, err := atomicfile.Write(s.dir, fileName(id), func(f *os.File) error {
		if _, err := f.Seek(headerLen, io.SeekStart); err != nil {
			return err
		}
		cw := &countingWriter{w: f}
		enc, err := zstd.NewWriter(nil,
			zstd.WithEncoderLevel(s.opts.Level),
			zstd.WithWindowSize(encoderWindow),
			zstd.WithEncoderConcurrency(1),
			zstd.WithEncoderCRC(true))
		if err != nil {
			return fmt.Errorf("compress: %w", err)
		}
		enc.ResetContentSize(cw, size)
		sum := &summingWriter{w: enc, max: s.opts.MaxSize}
		if fillErr = fill(sum); fillErr != nil {
			enc.Close()
			return fillErr
		}
		if err := enc.Close(); err != nil {
			return fmt.Errorf("compress: %w", err)
		}
		h.size, h.crc, h.bodyLen = uint64(sum.n), sum.crc, uint64(cw.n)
		_, err = f.WriteAt(h.marshal(), 0)
		return err
	})
	if err != nil {
		if fillErr != nil && errors.Is(err, fillErr) {
			return Meta{}, err
		}
		return Meta{}, s.saveFailed(u, id, err)
	}
	s.lastID, s.haveLast = u, true
	return Meta{ID: id, Created: h.created, Watermark: watermark, Size: int64(h.size), StoredSize: stored, Checksum: h.checksum()}, nil
}

// saveFailed reports a failed Save of checkpoint id (uuid u). When the
// failure came after the rename (the directory fsync failed: the checkpoint
// is visible under its name but not known to survive a power cut), the file
// is taken back — removed and the directory fsynced again — so that no
// restore, now or after a crash, picks up a checkpoint that was answered
// CHECKPOINT_FAILED (SPEC §4, "A failed fsync is never retried as if the
// data were safe"). Its id stays used: ids only grow.
func (s *Store) saveFailed(u uuid.UUID, id string, err error) error {
	err = fmt.Errorf("checkpoint: save %s in %s: %w", id, s.dir, err)
	if !errors.Is(err, atomicfile.ErrNotDurable) {
		return err
	}
	s.lastID, s.haveLast = u, true
	if rerr := atomicfile.Remove(s.dir, fileName(id)); rerr != nil {
		s.log.Error("a checkpoint whose fsync failed could not be taken back: after a power cut a restore may pick it up although it was never acknowledged; check the disk",
			"checkpoint_id", id, "err", err, "remove_err", rerr)
		return fmt.Errorf("%w; taking it back failed too: %w", err, rerr)
	}
	return fmt.Errorf("%w; the checkpoint was removed again", err)
}

// summingWriter counts and checksums what passes through it, refusing more
// than max bytes.
type summingWriter struct {
	w   io.Writer
	n   int64
	max int64
	crc uint32
}

func (s *summingWriter) Write(p []byte) (int, error) {
	if s.n+int64(len(p)) > s.max {
		return 0, fmt.Errorf("%w: checkpoint over %d bytes", ErrTooLarge, s.max)
	}
	s.crc = crc32.Update(s.crc, castagnoli, p)
	s.n += int64(len(p))
	return s.w.Write(p)
}

// compress writes data to w as one zstd frame carrying its content size and
// checksum. From concurrentThreshold up, the next block is compressed while
// the last is written. Blocks are not compressed in parallel: that copies
// the input into per-job buffers (25 MiB allocated for a 30 MiB
// checkpoint), which broke the supervisor's 64 MiB bound, for a third more
// speed (BenchmarkSave100MiB: 342 → 239 MB/s, 73 → 4.5 MB allocated).
func (s *Store) compress(w io.Writer, data []byte) error {
	conc := 1
	if len(data) >= concurrentThreshold {
		conc = runtime.GOMAXPROCS(0)
	}
	enc, err := zstd.NewWriter(nil,
		zstd.WithEncoderLevel(s.opts.Level),
		zstd.WithWindowSize(encoderWindow),
		zstd.WithEncoderConcurrency(conc),
		zstd.WithConcurrentBlocks(false),
		zstd.WithEncoderCRC(true))
	if err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	enc.ResetContentSize(w, int64(len(data)))
	if _, err := enc.Write(data); err != nil {
		enc.Close()
		return fmt.Errorf("compress: %w", err)
	}
	if err := enc.Close(); err != nil {
		return fmt.Errorf("compress: %w", err)
	}
	return nil
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// entry is one checkpoint as List sees it: its metadata, and why its header
// could not be read (nil when it could).
type entry struct {
	Meta
	err error
}

// List returns every checkpoint, newest first (by id: ids only grow, whatever the clock does). It reads
// headers only; a checkpoint whose header cannot be read or does not match
// its file is listed with Bad set and the problem in BadReason (Created then
// comes from the id's time, for a version 7 UUID, or the file's mtime).
// Temporary files are never listed.
func (s *Store) List() ([]Meta, error) {
	es, err := s.list()
	if err != nil {
		return nil, err
	}
	metas := make([]Meta, len(es))
	for i, e := range es {
		metas[i] = e.Meta
	}
	return metas, nil
}

func (s *Store) list() ([]entry, error) {
	des, err := os.ReadDir(s.dir)
	if err != nil {
		return nil, fmt.Errorf("checkpoint: list %s: %w", s.dir, err)
	}
	var ids []string
	markers := make(map[string]bool)
	for _, de := range des {
		name := de.Name()
		if strings.HasSuffix(name, atomicfile.TempSuffix) {
			continue
		}
		stem, ext := name[:len(name)-len(filepath.Ext(name))], filepath.Ext(name)
		if id, err := ParseID(stem); err != nil || id != stem {
			continue // not ours
		}
		if !de.Type().IsRegular() {
			if ext == ckptSuffix {
				s.warnIgnored(name, de.Type())
			}
			continue
		}
		switch ext {
		case ckptSuffix:
			ids = append(ids, stem)
		case pinSuffix, badSuffix:
			markers[name] = true
		}
	}
	es := make([]entry, 0, len(ids))
	for _, id := range ids {
		e, err := s.stat(id, markers)
		if errors.Is(err, ErrNotFound) {
			continue // pruned since ReadDir
		}
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b entry) int {
		return cmp.Compare(b.ID, a.ID) // ids grow with every Save (see order.go)
	})
	return es, nil
}

// warnIgnored logs, once per name, a checkpoint file that is never read
// because it is not a regular file: files in the store are opened without
// following symlinks (SPEC §9), so a symlinked checkpoint is not one.
func (s *Store) warnIgnored(name string, mode fs.FileMode) {
	s.ignoredMu.Lock()
	defer s.ignoredMu.Unlock()
	if s.ignored[name] {
		return
	}
	if s.ignored == nil {
		s.ignored = make(map[string]bool)
	}
	s.ignored[name] = true
	what := "not a regular file"
	if mode&fs.ModeSymlink != 0 {
		what = "a symlink"
	}
	s.log.Warn("checkpoint file ignored: it is "+what+", and checkpoint files are never followed; "+
		"replace it with the file itself (or remove it)", "file", filepath.Join(s.dir, name))
}

// Stat returns the metadata of checkpoint id from its header, without
// reading the body. A header that cannot be read gives Meta with Bad set
// and no error, as in List. Errors wrap ErrInvalidID or ErrNotFound.
func (s *Store) Stat(id string) (Meta, error) {
	id, err := ParseID(id)
	if err != nil {
		return Meta{}, err
	}
	e, err := s.stat(id, nil)
	return e.Meta, err
}

// stat reads id's header and markers. markers, when not nil, is the set of
// marker file names present (from a directory listing); nil means look.
// The returned error is only for a missing checkpoint; a damaged one is an
// entry with err set.
func (s *Store) stat(id string, markers map[string]bool) (entry, error) {
	f, e, _, err := s.open(id, markers)
	if f != nil {
		f.Close()
	}
	return e, err
}

// open opens checkpoint id and reads its header and markers. The file is
// returned open (positioned after the header) when the header is good, and
// the caller must close it; otherwise it is nil and e.err says why.
func (s *Store) open(id string, markers map[string]bool) (f *os.File, e entry, h header, err error) {
	e = entry{Meta: Meta{ID: id}}
	f, err = openNoFollow(filepath.Join(s.dir, fileName(id)))
	if errors.Is(err, os.ErrNotExist) {
		return nil, e, h, fmt.Errorf("%w: checkpoint %s (see `supervisor checkpoints list`)", ErrNotFound, id)
	}
	var fi os.FileInfo
	if err == nil {
		fi, err = f.Stat()
	}
	if err == nil {
		err = checkOwner(fi)
	}
	if err == nil {
		h, err = s.readHeader(f, id, fi.Size())
	} else {
		err = fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if err != nil {
		if f != nil {
			f.Close()
			f = nil
		}
		e.err = err
		s.fillDamaged(&e, fi)
	} else {
		e.Created = h.created
		e.Watermark = h.watermark
		e.Size = int64(h.size)
		e.StoredSize = fi.Size()
		e.Checksum = h.checksum()
	}
	s.readMarkers(&e, markers)
	return f, e, h, nil
}

// fillDamaged completes the Meta of a checkpoint whose header is unusable.
func (s *Store) fillDamaged(e *entry, fi os.FileInfo) {
	e.Bad = true
	e.BadReason = e.err.Error()
	if fi != nil {
		e.StoredSize = fi.Size()
		e.Created = fi.ModTime().UTC()
	}
	if u, err := uuid.Parse(e.ID); err == nil && u.Version() == 7 {
		sec, nsec := u.Time().UnixTime()
		e.Created = time.Unix(sec, nsec).UTC()
	}
}

// readHeader reads and checks the header of f, the file of checkpoint id.
func (s *Store) readHeader(f *os.File, id string, fileSize int64) (header, error) {
	var b [headerLen]byte
	n, err := io.ReadFull(f, b[:])
	if err != nil && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return header{}, fmt.Errorf("checkpoint %s: read header: %w", id, err)
	}
	h, err := unmarshalHeader(b[:n], fileSize, s.opts.MaxSize)
	if err != nil {
		return h, fmt.Errorf("checkpoint %s: %w", id, err)
	}
	if got := h.id.String(); got != id {
		return h, fmt.Errorf("checkpoint %s: %w: header holds id %s (file renamed or copied?)", id, ErrCorrupt, got)
	}
	return h, nil
}

// Load reads checkpoint id, decompresses it and verifies its checksum. It
// returns the exact bytes given to Save. Decompression is bounded: the
// output never exceeds the header's size (itself at most Options.MaxSize),
// whatever the body holds. Errors wrap ErrInvalidID, ErrNotFound or
// ErrCorrupt (with ErrTooLarge for a header over the limit); on ErrCorrupt
// the returned Meta holds what the header said, if it was readable.
func (s *Store) Load(id string) (Meta, []byte, error) {
	id, err := ParseID(id)
	if err != nil {
		return Meta{}, nil, err
	}
	e, data, err := s.load(id)
	return e.Meta, data, err
}

// openReadable opens checkpoint id for reading its body: errors for a
// missing file and for a header that does not check out (e.err).
func (s *Store) openReadable(id string) (*os.File, entry, header, error) {
	f, e, h, err := s.open(id, nil)
	if err == nil && e.err != nil {
		err = e.err
	}
	return f, e, h, err
}

func (s *Store) load(id string) (entry, []byte, error) {
	f, e, h, err := s.openReadable(id)
	if err != nil {
		return e, nil, err
	}
	defer f.Close()
	data, err := decompress(io.NewSectionReader(f, headerLen, int64(h.bodyLen)), h.size)
	if err != nil {
		return e, nil, fmt.Errorf("checkpoint %s: %w: %w", id, ErrCorrupt, err)
	}
	if got := crc32.Checksum(data, castagnoli); got != h.crc {
		return e, nil, fmt.Errorf("checkpoint %s: %w: checksum mismatch: header %08x, data %08x", id, ErrCorrupt, h.crc, got)
	}
	return e, data, nil
}

// decompress decodes one zstd stream from r that must yield exactly size
// bytes. The output buffer is allocated once at size (at most
// Options.MaxSize, checked with the header) and never grows: a body that
// decodes to more is corrupt, found after one extra byte. The decoder's
// window, its only other large allocation, is capped at
// max(size, decoderWindowFloor), so a hostile frame header cannot make it
// reserve more. The decoder runs synchronously (no goroutines): zstd
// decoding is sequential and this is the fastest mode measured.
func decompress(r io.Reader, size uint64) ([]byte, error) {
	limit := max(size, decoderWindowFloor)
	dec, err := zstd.NewReader(r,
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxMemory(limit),
		zstd.WithDecoderMaxWindow(limit))
	if err != nil {
		return nil, err
	}
	defer dec.Close()
	data := make([]byte, size)
	if _, err := io.ReadFull(dec, data); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, fmt.Errorf("body decompresses to fewer than the %d bytes the header claims", size)
		}
		return nil, fmt.Errorf("decompress: %w", err)
	}
	var one [1]byte
	if n, err := io.ReadFull(dec, one[:]); n > 0 {
		return nil, fmt.Errorf("body decompresses to more than the %d bytes the header claims", size)
	} else if !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("decompress: %w", err)
	}
	return data, nil
}

// LoadCompressed returns checkpoint id's data as stored: one zstd frame that
// declares its content size, after checking that it decompresses to exactly
// the header's size and checksum. The check streams (the decoder keeps one
// window, at most 8 MiB): the decompressed data is never held, so a 100 MiB
// checkpoint costs its compressed size. A frame that does not declare its
// content size (written by SaveStream without a size) is returned with
// ErrNoContentSize; use Load. Other errors are Load's.
func (s *Store) LoadCompressed(id string) (Meta, []byte, error) {
	id, err := ParseID(id)
	if err != nil {
		return Meta{}, nil, err
	}
	e, z, err := s.loadCompressed(id)
	return e.Meta, z, err
}

// ErrNoContentSize: the stored frame does not declare its content size.
var ErrNoContentSize = errors.New("checkpoint: stored frame does not declare its content size")

func (s *Store) loadCompressed(id string) (entry, []byte, error) {
	f, e, h, err := s.openReadable(id)
	if err != nil {
		return e, nil, err
	}
	defer f.Close()
	z := make([]byte, h.bodyLen)
	if _, err := io.ReadFull(io.NewSectionReader(f, headerLen, int64(h.bodyLen)), z); err != nil {
		return e, nil, fmt.Errorf("checkpoint %s: %w: read body: %w", id, ErrCorrupt, err)
	}
	var zh zstd.Header
	if err := zh.Decode(z); err != nil {
		return e, nil, fmt.Errorf("checkpoint %s: %w: %w", id, ErrCorrupt, err)
	}
	if !zh.HasFCS || zh.FrameContentSize != h.size {
		return e, nil, fmt.Errorf("checkpoint %s: %w", id, ErrNoContentSize)
	}
	dec, err := zstd.NewReader(bytes.NewReader(z),
		zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderLowmem(true),
		zstd.WithDecoderMaxMemory(decoderWindowFloor),
		zstd.WithDecoderMaxWindow(decoderWindowFloor))
	if err != nil {
		return e, nil, err
	}
	defer dec.Close()
	crc := crc32.New(castagnoli)
	n, err := io.Copy(crc, io.LimitReader(dec, int64(h.size)+1))
	if err != nil {
		return e, nil, fmt.Errorf("checkpoint %s: %w: decompress: %w", id, ErrCorrupt, err)
	}
	if uint64(n) != h.size {
		return e, nil, fmt.Errorf("checkpoint %s: %w: body decompresses to %d bytes, the header claims %d", id, ErrCorrupt, n, h.size)
	}
	if got := crc.Sum32(); got != h.crc {
		return e, nil, fmt.Errorf("checkpoint %s: %w: checksum mismatch: header %08x, data %08x", id, ErrCorrupt, h.crc, got)
	}
	return e, z, nil
}

// LatestCompressed is Latest returning each checkpoint as LoadCompressed
// does. A newest good checkpoint that does not declare its content size
// makes it fail with ErrNoContentSize (use Latest then): it is not skipped.
func (s *Store) LatestCompressed() (Meta, []byte, []Skipped, error) {
	es, err := s.list()
	if err != nil {
		return Meta{}, nil, nil, err
	}
	return s.firstLoadableWith(es, s.loadCompressed)
}

// Latest returns the newest checkpoint that is not marked bad and loads and
// verifies cleanly, with every newer one it passed over and why (so the
// caller can log and count each). With no loadable checkpoint it returns an
// error wrapping ErrNotFound, still with the skipped list.
func (s *Store) Latest() (Meta, []byte, []Skipped, error) {
	es, err := s.list()
	if err != nil {
		return Meta{}, nil, nil, err
	}
	return s.firstLoadable(es)
}

// Previous is Latest restricted to checkpoints strictly older than id (in
// List order): the crash-loop fallback (--fallback-on-crash-loop).
// Errors wrap ErrInvalidID, or ErrNotFound when id is not in the store or no
// older checkpoint loads.
func (s *Store) Previous(id string) (Meta, []byte, []Skipped, error) {
	return s.previousWith(id, s.load)
}

// PreviousCompressed is Previous returning the stored zstd frame (see
// LoadCompressed).
func (s *Store) PreviousCompressed(id string) (Meta, []byte, []Skipped, error) {
	return s.previousWith(id, s.loadCompressed)
}

func (s *Store) previousWith(id string, load func(id string) (entry, []byte, error)) (Meta, []byte, []Skipped, error) {
	id, err := ParseID(id)
	if err != nil {
		return Meta{}, nil, nil, err
	}
	es, err := s.list()
	if err != nil {
		return Meta{}, nil, nil, err
	}
	i := slices.IndexFunc(es, func(e entry) bool { return e.ID == id })
	if i < 0 {
		return Meta{}, nil, nil, fmt.Errorf("%w: checkpoint %s", ErrNotFound, id)
	}
	return s.firstLoadableWith(es[i+1:], load)
}

func (s *Store) firstLoadable(es []entry) (Meta, []byte, []Skipped, error) {
	return s.firstLoadableWith(es, s.load)
}

func (s *Store) firstLoadableWith(es []entry, load func(id string) (entry, []byte, error)) (Meta, []byte, []Skipped, error) {
	var skipped []Skipped
	for _, e := range es {
		switch {
		case e.Bad && e.err == nil:
			skipped = append(skipped, Skipped{ID: e.ID, Err: fmt.Errorf("%w: %s", ErrMarkedBad, e.BadReason)})
			continue
		case e.err != nil:
			skipped = append(skipped, Skipped{ID: e.ID, Err: e.err})
			continue
		}
		le, data, err := load(e.ID)
		if errors.Is(err, ErrNoContentSize) {
			return le.Meta, nil, skipped, err
		}
		if err != nil {
			skipped = append(skipped, Skipped{ID: e.ID, Err: err})
			continue
		}
		if le.Bad { // marked bad since we listed
			skipped = append(skipped, Skipped{ID: e.ID, Err: fmt.Errorf("%w: %s", ErrMarkedBad, le.BadReason)})
			continue
		}
		return le.Meta, data, skipped, nil
	}
	return Meta{}, nil, skipped, fmt.Errorf("%w: no loadable checkpoint in %s (%d skipped)", ErrNotFound, s.dir, len(skipped))
}
