package agentproc

import (
	"bytes"
	"os"
	"strconv"
)

// GroupRSS is the resident memory, in bytes, of every process in process
// group pgid, read from /proc (0 and false when none is found: the group
// is gone or /proc is not readable). An agent's group is its own pid.
func GroupRSS(pgid int) (int64, bool) {
	if pgid <= 0 {
		return 0, false // 0 is the kernel's threads, not an agent
	}
	d, err := os.Open("/proc")
	if err != nil {
		return 0, false
	}
	defer d.Close()
	names, err := d.Readdirnames(-1)
	if err != nil {
		return 0, false
	}
	page := int64(os.Getpagesize())
	var sum int64
	found := false
	for _, n := range names {
		if n[0] < '0' || n[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + n + "/stat")
		if err != nil {
			continue // exited meanwhile
		}
		grp, rss, ok := parseStat(b)
		if ok && grp == pgid {
			sum += rss * page
			found = true
		}
	}
	return sum, found
}

// parseStat reads the process group (field 5) and resident pages (field
// 24) of a /proc/PID/stat line; the command (field 2) may hold spaces and
// parentheses, so fields are counted after its last ')'.
func parseStat(b []byte) (pgrp int, rssPages int64, ok bool) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+1:]) // f[0] is field 3 (state)
	if len(f) < 22 {
		return 0, 0, false
	}
	g, err1 := strconv.Atoi(string(f[2]))
	r, err2 := strconv.ParseInt(string(f[21]), 10, 64)
	if err1 != nil || err2 != nil {
		return 0, 0, false
	}
	return g, r, true
}
