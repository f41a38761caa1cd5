package wal

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// scanAhead verifies recovery's segments in the background, as many at a
// time as there are CPUs, so that a restart on a long log checks its
// records on every core rather than on one. Recovery still decides
// segment by segment, in order: it takes a result only where it is exactly
// what scanSegment would return with the real previous segment's end, and
// scans again itself otherwise (see take).
//
// A worker calls scanSegment with no previous segment (havePrev false). The
// previous segment's end enters scanSegment only at the header (a header
// whose "last sequence before" differs is damage at offset 0, found before
// any record is read) and as the start of a last segment whose header never
// reached the disk (headerTorn, prevLast set to it: without a previous
// segment, 0); every other step depends on the file alone. Scans only read,
// and recovery changes a segment file only after it has taken that
// segment's result (cutSegment, repairTail), or renames files whose results
// it will not take (quarantine): a result is never stale when it is taken.
// TestScanAheadMatchesInPlace compares the two ways on damaged logs.
type scanAhead struct {
	dir  string
	idx  []uint64
	opts func(i int) scanOpts // the options but prev and havePrev
	res  []aheadResult
	done []chan struct{} // closed when res[i] is set
	next atomic.Int64    // the next segment a worker takes
	stop atomic.Bool     // recovery is over: workers take no more
	wg   sync.WaitGroup
}

// scanWorkers is how many segments recovery scans at once (tests set it).
var scanWorkers = func() int { return runtime.GOMAXPROCS(0) }

// scanAheadSettle makes startScanAhead return only when the workers have
// scanned every segment, so that recovery takes each result from them
// (tests).
var scanAheadSettle = false

type aheadResult struct {
	sc  segmentScan
	err error
}

// startScanAhead starts the workers over idx. close stops and waits for
// them; it must be called before the segments' files are used otherwise.
func startScanAhead(dir string, idx []uint64, opts func(i int) scanOpts) *scanAhead {
	a := &scanAhead{dir: dir, idx: idx, opts: opts, res: make([]aheadResult, len(idx)), done: make([]chan struct{}, len(idx))}
	for i := range a.done {
		a.done[i] = make(chan struct{})
	}
	workers := min(scanWorkers(), len(idx))
	if workers < 2 {
		workers = 0 // one CPU or one segment: take scans in place, as before
	}
	for range workers {
		a.wg.Add(1)
		go a.work()
	}
	if scanAheadSettle {
		a.wg.Wait()
	}
	return a
}

func (a *scanAhead) work() {
	defer a.wg.Done()
	for {
		i := int(a.next.Add(1) - 1)
		if i >= len(a.idx) || a.stop.Load() {
			return
		}
		a.res[i] = a.scan(i)
		close(a.done[i])
	}
}

// scan is scanSegment over segment i with no previous segment.
func (a *scanAhead) scan(i int) aheadResult {
	index := a.idx[i]
	name := segmentName(index)
	f, err := openRead(segmentPath(a.dir, index))
	if err != nil {
		return aheadResult{err: err}
	}
	defer f.Close()
	sc, err := scanSegment(f, name, index, a.opts(i))
	return aheadResult{sc: sc, err: err}
}

// take returns segment i's scan with prev as the end of the previous
// segment (havePrev): the worker's result where it equals what
// scanSegment(…, prev, havePrev) returns, else ok false (scan it in place).
// It waits for the worker if one has taken the segment, and claims the
// segment for itself if none has.
func (a *scanAhead) take(i int, prev uint64, havePrev bool) (segmentScan, bool) {
	if a.next.CompareAndSwap(int64(i), int64(i+1)) {
		return segmentScan{}, false // nobody has it: scanned in place
	}
	<-a.done[i]
	r := a.res[i]
	switch {
	case r.err != nil:
		return segmentScan{}, false // scanned again, to fail (or not) exactly as before
	case r.sc.corrupt != nil && r.sc.corrupt.Offset == 0:
		return r.sc, true // damage found at the header, before the link is checked
	case havePrev && r.sc.prevLast != prev:
		// A broken link, which scanSegment reports, or a last segment
		// whose header never reached the disk (headerTorn): scanSegment
		// starts it at prev.
		return segmentScan{}, false
	}
	return r.sc, true
}

// close stops the workers and waits for them.
func (a *scanAhead) close() {
	a.stop.Store(true)
	a.wg.Wait()
}
