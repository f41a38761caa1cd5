package replica

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
)

// Object keys, under PREFIX/generations/GEN/ (see doc.go):
//
//	generation-SHA.json                       who started the generation
//	checkpoints/WM-ID-SHA.ckpt                a stored checkpoint file, as is
//	wal/AFTER-LAST-MS-SHA.chunk               WAL entries in (AFTER, LAST]
//	files/NAME/NANOS-SHA                      a version of a small file (or a base of the request journal)
//	files/requests-journal/BASE-FROM-TO-NANOS-SHA
//	                                          a delta of the request journal: its bytes [FROM, TO), after the base of version BASE
//	owners/SESSION-SHA.json                   a supervisor that wrote it (OwnerClaim)
//
// WM, AFTER and LAST are 16 hex digits (lexical order is numeric order),
// MS the chunk's cut time in unix milliseconds and NANOS a version's time in
// unix nanoseconds (16 hex digits; a delta's BASE is its base's NANOS, FROM
// and TO byte offsets in the journal, NANOS its upload time), SHA the SHA-256 of the object's bytes (64
// hex digits). A name says everything a restore plans with, so one listing
// plans a restore; the checksum in it is verified on every download.

const generationsDir = "generations/"

// replicatedFiles are the small files of the data directory kept in the
// replica, newest version wins.
var replicatedFiles = []string{"evolution.json", "agent.json"}

// MaxLedgerBytes is the largest evolution.json uploaded and restored: the
// evolution ledger's own bound (evolution.MaxLedgerSize, which a test
// checks; replica does not import evolution). Each module's newest
// promotion keeps up to 1 MiB of code, so a 16 MiB limit, the other
// files', stopped all replication once some 16 modules were promoted.
const MaxLedgerBytes = 256 << 20

// fileLimit is the largest replicated file of each name.
func fileLimit(name string) int64 {
	if name == "evolution.json" {
		return MaxLedgerBytes
	}
	return 16 << 20
}

// JournalFile is the request journal's name in the replica: the durable
// prefix of DATA_DIR/requests/journal (Local.Journal), restored into
// JournalPath. The replica treats it as bytes with checksums, uploaded as a
// chain: a base (files/requests-journal/NANOS-SHA, the whole durable prefix
// [0, SIZE) of one journal file) and deltas after it
// (files/requests-journal/BASE-FROM-TO-NANOS-SHA, the bytes [FROM, TO) of
// the same file; the first starts at the base's size, each next one where
// the previous ended). Between two compactions the journal only grows, so
// a change costs a delta of its own size; a compaction (a new file) or a
// chain grown too long starts a new base (see syncJournal). A replica
// written before deltas holds bases only, restored as they are.
const JournalFile = "requests-journal"

// maxJournalDeltas bounds the deltas after one base: a restore downloads at
// most a base and this many deltas (merging keeps chains far shorter: see
// syncJournal).
const maxJournalDeltas = 24

// JournalPath is where a restore puts the journal, relative to the data
// directory.
var JournalPath = filepath.Join("requests", "journal")

// journalLimit bounds a journal object a restore downloads.
const journalLimit = 4 << 30

func sum(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

func hex16(v uint64) string { return fmt.Sprintf("%016x", v) }

func parseHex16(s string) (uint64, bool) {
	if len(s) != 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 16, 64)
	return v, err == nil
}

func validSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	_, err := hex.DecodeString(s)
	return err == nil
}

// newGenerationID is a version 7 UUID: lexical order is creation order.
func newGenerationID() (string, error) {
	u, err := uuid.NewV7()
	if err != nil {
		return "", err
	}
	return u.String(), nil
}

func validGeneration(s string) bool {
	u, err := uuid.Parse(s)
	return err == nil && u.Version() == 7 && u.String() == s
}

func genDir(gen string) string { return generationsDir + gen + "/" }

func generationKey(gen, sha string) string { return genDir(gen) + "generation-" + sha + ".json" }

func checkpointKey(gen string, wm uint64, id, sha string) string {
	return genDir(gen) + "checkpoints/" + hex16(wm) + "-" + id + "-" + sha + ".ckpt"
}

func chunkKey(gen string, after, last uint64, cut time.Time, sha string) string {
	return genDir(gen) + "wal/" + hex16(after) + "-" + hex16(last) + "-" + hex16(uint64(cut.UnixMilli())) + "-" + sha + ".chunk"
}

func ownerKey(gen, session, sha string) string {
	return genDir(gen) + "owners/" + session + "-" + sha + ".json"
}

func fileKey(gen, name string, at time.Time, sha string) string {
	return genDir(gen) + "files/" + name + "/" + hex16(uint64(at.UnixNano())) + "-" + sha
}

func journalDeltaKey(gen string, base time.Time, from, to int64, at time.Time, sha string) string {
	return genDir(gen) + "files/" + JournalFile + "/" + hex16(uint64(base.UnixNano())) + "-" + hex16(uint64(from)) + "-" +
		hex16(uint64(to)) + "-" + hex16(uint64(at.UnixNano())) + "-" + sha
}

// object is one parsed key of a generation.
type object struct {
	Key  string // relative to the prefix
	Size int64
	// LastModified is the server's time of the upload.
	LastModified time.Time
	Gen          string
	Kind         string // "generation", "checkpoint", "chunk", "file", "journal-delta", "owner"
	SHA          string

	ID        string    // checkpoint id; owner: its session
	Watermark uint64    // checkpoint
	After     uint64    // chunk: (After, Last]
	Last      uint64    // chunk
	Time      time.Time // chunk: cut time; file, journal-delta: version time; checkpoint: created (from its id)
	Name      string    // file, journal-delta
	Base      time.Time // journal-delta: its base's version time
	From, To  int64     // journal-delta: the bytes [From, To) of the journal
}

// parseKey parses a key relative to the prefix; ok is false for a key this
// layout does not name (it is ignored, and listed as such).
func parseKey(rel string) (object, bool) {
	rest, ok := strings.CutPrefix(rel, generationsDir)
	if !ok {
		return object{}, false
	}
	gen, rest, ok := strings.Cut(rest, "/")
	if !ok || !validGeneration(gen) {
		return object{}, false
	}
	o := object{Key: rel, Gen: gen}
	switch {
	case strings.HasPrefix(rest, "generation-") && strings.HasSuffix(rest, ".json"):
		o.Kind, o.SHA = "generation", strings.TrimSuffix(strings.TrimPrefix(rest, "generation-"), ".json")
		return o, validSum(o.SHA)
	case strings.HasPrefix(rest, "checkpoints/") && strings.HasSuffix(rest, ".ckpt"):
		body := strings.TrimSuffix(strings.TrimPrefix(rest, "checkpoints/"), ".ckpt")
		// WM(16) - ID(36) - SHA(64)
		if len(body) != 16+1+36+1+64 || body[16] != '-' || body[53] != '-' {
			return object{}, false
		}
		wm, ok := parseHex16(body[:16])
		u, err := uuid.Parse(body[17:53])
		if !ok || err != nil || u.String() != body[17:53] {
			return object{}, false
		}
		sec, nsec := u.Time().UnixTime()
		o.Kind, o.Watermark, o.ID, o.SHA, o.Time = "checkpoint", wm, body[17:53], body[54:], time.Unix(sec, nsec).UTC()
		return o, validSum(o.SHA)
	case strings.HasPrefix(rest, "wal/") && strings.HasSuffix(rest, ".chunk"):
		f := strings.Split(strings.TrimSuffix(strings.TrimPrefix(rest, "wal/"), ".chunk"), "-")
		if len(f) != 4 {
			return object{}, false
		}
		after, ok1 := parseHex16(f[0])
		last, ok2 := parseHex16(f[1])
		ms, ok3 := parseHex16(f[2])
		if !ok1 || !ok2 || !ok3 || last <= after {
			return object{}, false
		}
		o.Kind, o.After, o.Last, o.Time, o.SHA = "chunk", after, last, time.UnixMilli(int64(ms)).UTC(), f[3]
		return o, validSum(o.SHA)
	case strings.HasPrefix(rest, "owners/") && strings.HasSuffix(rest, ".json"):
		body := strings.TrimSuffix(strings.TrimPrefix(rest, "owners/"), ".json")
		// SESSION(36) - SHA(64)
		if len(body) != 36+1+64 || body[36] != '-' || !validGeneration(body[:36]) {
			return object{}, false
		}
		o.Kind, o.ID, o.SHA = "owner", body[:36], body[37:]
		return o, validSum(o.SHA)
	case strings.HasPrefix(rest, "files/"):
		name, ver, ok := strings.Cut(strings.TrimPrefix(rest, "files/"), "/")
		if ok && name == JournalFile && len(ver) == 4*17+64 {
			return parseJournalDelta(o, ver)
		}
		if !ok || !isReplicatedFile(name) || len(ver) != 16+1+64 || ver[16] != '-' {
			return object{}, false
		}
		ns, ok := parseHex16(ver[:16])
		if !ok {
			return object{}, false
		}
		o.Kind, o.Name, o.Time, o.SHA = "file", name, time.Unix(0, int64(ns)).UTC(), ver[17:]
		return o, validSum(o.SHA)
	}
	return object{}, false
}

// parseJournalDelta parses BASE-FROM-TO-NANOS-SHA.
func parseJournalDelta(o object, ver string) (object, bool) {
	f := strings.Split(ver, "-")
	if len(f) != 5 {
		return object{}, false
	}
	var n [4]uint64
	for i := range n {
		v, ok := parseHex16(f[i])
		if !ok || v > 1<<62 {
			return object{}, false
		}
		n[i] = v
	}
	if n[1] >= n[2] {
		return object{}, false
	}
	o.Kind, o.Name, o.SHA = "journal-delta", JournalFile, f[4]
	o.Base, o.From, o.To, o.Time = time.Unix(0, int64(n[0])).UTC(), int64(n[1]), int64(n[2]), time.Unix(0, int64(n[3])).UTC()
	return o, validSum(o.SHA)
}

func isReplicatedFile(name string) bool {
	if name == JournalFile {
		return true
	}
	for _, f := range replicatedFiles {
		if f == name {
			return true
		}
	}
	return false
}
