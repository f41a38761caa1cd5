package wal

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// Recovery with segments scanned ahead on several goroutines ends exactly
// as recovery scanning them one by one in place: the same entries, the
// same report and the same files, whatever the damage. Each case damages a
// log of many small segments (byte flips, zeroed ranges, a cut or missing
// segment, a header whose link to the previous segment is broken but whose
// checksum is right, one of another format version, a last segment whose
// header is zero with or without data after it),
// copies it and opens one copy each way. WAL_SCANAHEAD_CASES sets how many
// cases (default 150).
func TestScanAheadMatchesInPlace(t *testing.T) {
	cases := envInt(t, "WAL_SCANAHEAD_CASES", 150)
	base := t.TempDir()
	o := Options{Dir: base, SegmentSize: MinSegmentSize, NoPreallocate: true, Logger: slog.New(slog.DiscardHandler)}
	l, err := Open(o)
	if err != nil {
		t.Fatal(err)
	}
	seq := uint64(0)
	for seq < 200 {
		batch := make([]Entry, 1+int(seq%3))
		for i := range batch {
			seq++
			batch[i] = Entry{Sequence: seq, Data: []byte(fmt.Sprintf("entry %d %s", seq, strings.Repeat("x", int(seq*37%700))))}
		}
		if _, err := l.Append(batch...); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	segs, err := listSegments(base)
	if err != nil {
		t.Fatal(err)
	}
	defer func(w func() int) { scanWorkers, scanAheadSettle = w, false }(scanWorkers)
	rng := rand.New(rand.NewPCG(31, 1))
	for c := range cases {
		damage := damageLog(rng, segs)
		open := func(workers int, settle bool) string {
			scanWorkers = func() int { return workers }
			scanAheadSettle = settle
			dir := fuzzDir(t) // tmpfs when there is one: fsyncs are free
			copyFiles(t, base, dir)
			damage.apply(t, dir)
			o := o
			o.Dir = dir
			o.CoveredThrough = damage.covered
			l, err := Open(o)
			if err != nil {
				return "Open: " + err.Error()
			}
			defer l.Close()
			got := fmt.Sprintf("recovery %s\nlast %d\n", describeRecovery(l.Recovery()), l.LastSequence())
			var entries []string
			if err := l.ReadAfter(0, func(e Entry) error {
				entries = append(entries, fmt.Sprintf("%d:%x", e.Sequence, crc32.ChecksumIEEE(e.Data)))
				return nil
			}); err != nil {
				got += "ReadAfter: " + err.Error() + "\n"
			}
			return got + "entries " + strings.Join(entries, " ") + "\nfiles " + listFiles(t, dir)
		}
		inPlace := open(0, false)
		for _, settle := range []bool{true, false} {
			ahead := open(4, settle)
			if inPlace != ahead {
				a, b := strings.Fields(ahead), strings.Fields(inPlace)
				i := 0
				for i < min(len(a), len(b)) && a[i] == b[i] {
					i++
				}
				t.Fatalf("case %d (%s): scanned ahead (all scans done first: %v) and in place differ from word %d: %q against %q\nin place:\n%s",
					c, damage, settle, i, strings.Join(a[i:min(i+8, len(a))], " "), strings.Join(b[i:min(i+8, len(b))], " "), inPlace)
			}
		}
	}
}

// logDamage is one random change to a log's files.
type logDamage struct {
	what    string
	covered uint64
	apply   func(t *testing.T, dir string)
}

func (d logDamage) String() string { return d.what }

func damageLog(rng *rand.Rand, segs []uint64) logDamage {
	pick := segs[rng.IntN(len(segs))]
	name := segmentName(pick)
	var covered uint64
	if rng.IntN(4) == 0 {
		covered = uint64(rng.IntN(400)) // some damage lies below a checkpoint
	}
	edit := func(what string, fn func(b []byte) []byte) logDamage {
		return logDamage{what: fmt.Sprintf("%s in %s, covered through %d", what, name, covered), covered: covered, apply: func(t *testing.T, dir string) {
			p := filepath.Join(dir, name)
			b, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, fn(b), 0o600); err != nil {
				t.Fatal(err)
			}
		}}
	}
	switch rng.IntN(9) {
	case 0, 1:
		type flip struct {
			at  int
			xor byte
		}
		flips := make([]flip, 1+rng.IntN(3))
		for i := range flips {
			flips[i] = flip{rng.IntN(MinSegmentSize), byte(1 + rng.IntN(255))}
		}
		return edit(fmt.Sprintf("byte flips %v", flips), func(b []byte) []byte {
			for _, f := range flips {
				b[f.at%len(b)] ^= f.xor
			}
			return b
		})
	case 2:
		off, n := rng.IntN(MinSegmentSize), 1+rng.IntN(4096)
		return edit(fmt.Sprintf("zeros at %d (+%d)", off, n), func(b []byte) []byte {
			clear(b[min(off, len(b)):min(off+n, len(b))])
			return b
		})
	case 3:
		cut := rng.IntN(MinSegmentSize)
		return edit(fmt.Sprintf("cut at %d", cut), func(b []byte) []byte { return b[:min(cut, len(b))] })
	case 4:
		return logDamage{what: fmt.Sprintf("%s removed, covered through %d", name, covered), covered: covered, apply: func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}}
	case 5:
		delta := uint64(1 + rng.IntN(3))
		return edit(fmt.Sprintf("header link moved by %d", delta), func(b []byte) []byte {
			binary.BigEndian.PutUint64(b[20:], binary.BigEndian.Uint64(b[20:])+delta)
			binary.BigEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
			return b
		})
	case 6:
		name = segmentName(segs[rng.IntN(2)]) // the first one too, which has no link to check
		return edit("header says format version 2", func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[8:], 2)
			binary.BigEndian.PutUint32(b[28:], crc32.Checksum(b[:28], castagnoli))
			return b
		})
	case 7:
		name = segmentName(segs[len(segs)-1])
		return edit("header of the last segment zeroed", func(b []byte) []byte {
			clear(b[:segmentHeaderSize])
			return b
		})
	default:
		name = segmentName(segs[len(segs)-1])
		return edit("last segment all zeros (its header never reached the disk)", func(b []byte) []byte {
			clear(b)
			return b
		})
	}
}

// stamp is a quarantined file's time suffix, which differs between runs.
var stamp = regexp.MustCompile(`\.corrupt-\d{8}T\d{6}Z`)

func listFiles(t *testing.T, dir string) string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, de := range des {
		if de.Name() == "LOCK" {
			continue
		}
		b, _ := os.ReadFile(filepath.Join(dir, de.Name()))
		out = append(out, fmt.Sprintf("%s=%d:%x", stamp.ReplaceAllString(de.Name(), ".corrupt"), len(b), crc32.ChecksumIEEE(b)))
	}
	slices.Sort(out)
	return strings.Join(out, " ")
}

func describeRecovery(r Recovery) string {
	s := fmt.Sprintf("segments %d entries %d truncated %d", r.Segments, r.Entries, r.TruncatedBytes)
	if r.Corruption != nil {
		s += " corruption " + stamp.ReplaceAllString(fmt.Sprintf("%+v", r.Corruption), ".corrupt")
	}
	for _, c := range r.Covered {
		s += " covered " + stamp.ReplaceAllString(fmt.Sprintf("%+v", *c), ".corrupt")
	}
	return s
}

// envInt is the environment variable name as a positive number, or def.
func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive number", name, s)
	}
	return n
}
