package agentproc

import "os"

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
// 24) of a /proc/PID/stat line.
func parseStat(b []byte) (pgrp int, rssPages int64, ok bool) {
	g, ok1 := parseUint(statField(b, 5))
	r, ok2 := parseUint(statField(b, 24))
	if !ok1 || !ok2 || g > 1<<31 {
		return 0, 0, false
	}
	return int(g), int64(r), true
}
