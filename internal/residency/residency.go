//go:build linux

// Package residency gives back the pages of the supervisor's own executable
// that only its start-up touched (issue 31: idle under 15 MiB RSS).
//
// Most of an idle supervisor's resident memory is not its heap (about 4 MiB)
// but pages of its 25 MB executable: package initialisation runs code and
// reads tables all over the binary, and the kernel maps up to 64 KiB around
// each page faulted in ("fault-around"), so after start-up some 13 MiB of
// text and read-only data stay mapped although an idle supervisor runs a
// small part of it. Trim unmaps them (MADV_DONTNEED): the pages stay in the
// page cache, and whichever the supervisor uses again come back at the cost
// of a minor fault, 64 KiB at a time. (Fault-around applies again: with
// MADV_RANDOM, which an earlier version also set and which stops only
// read-ahead, /proc/PID/pagemap showed every resident 64 KiB block of the
// executable whole.)
// What comes back: the code and tables an idle supervisor runs, and at each
// garbage collection the function tables (pclntab) of every goroutine's
// frames, which the collector reads to scan their stacks (1.5-2 MiB).
//
// What this saves is resident set: what ps, the OOM killer's score and a
// VmRSS-based limit count. The pages stay in the page cache, which a memory
// cgroup charges either way, as reclaimable cache.
//
// Only read-only, file-backed mappings of the executable with no anonymous
// (copied-on-write) page are touched: dropping one of those would lose what
// was written to it (a relocated RELRO page in a position-independent
// build), so such a mapping is left alone.
package residency

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Trim unmaps the pages of the executable's read-only mappings. It returns
// how many bytes of mappings it advised; an error says why it could not (the
// supervisor runs on either way).
func Trim() (int64, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, fmt.Errorf("residency: %w", err)
	}
	maps, err := readMaps(exe)
	if err != nil {
		return 0, err
	}
	var total int64
	for _, m := range maps {
		if m.writable || m.anonymousKB > 0 {
			continue
		}
		// The raw call: the range is a mapping's address, not Go memory.
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, m.start, m.end-m.start, unix.MADV_DONTNEED); errno != 0 {
			return total, fmt.Errorf("residency: madvise(MADV_DONTNEED) %x-%x: %w", m.start, m.end, errno)
		}
		total += int64(m.end - m.start)
	}
	return total, nil
}

type mapping struct {
	start, end  uintptr
	writable    bool
	anonymousKB int64
}

// readMaps lists the mappings of path in /proc/self/smaps.
func readMaps(path string) ([]mapping, error) {
	data, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		return nil, fmt.Errorf("residency: %w", err)
	}
	var out []mapping
	var cur *mapping
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line := sc.Text()
		f := strings.Fields(line)
		if len(f) >= 5 && strings.Contains(f[0], "-") && !strings.HasSuffix(f[0], ":") {
			cur = nil
			if len(f) < 6 || strings.Join(f[5:], " ") != path {
				continue
			}
			lo, hi, ok := strings.Cut(f[0], "-")
			start, err1 := strconv.ParseUint(lo, 16, 64)
			end, err2 := strconv.ParseUint(hi, 16, 64)
			if !ok || err1 != nil || err2 != nil {
				return nil, fmt.Errorf("residency: cannot parse mapping %q", line)
			}
			out = append(out, mapping{start: uintptr(start), end: uintptr(end), writable: strings.Contains(f[1], "w") || f[1][3] != 'p'})
			cur = &out[len(out)-1]
			continue
		}
		if cur != nil && len(f) >= 2 && f[0] == "Anonymous:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("residency: cannot parse %q", line)
			}
			cur.anonymousKB = kb
		}
	}
	return out, sc.Err()
}
