package durable

import "sync"

// Worker is the stores' one worker goroutine. It runs, one at a time,
// the checkpoint saves the primary's frame reader queues and the owner's slow
// jobs (assembling a restore, rolling history back for a --no-wal restore,
// preparing an evolution's backup, closing a trial's scratch stores). The
// owner posts a job and goes on; the job reports back on Supervisor.stored.
// So the owner loop never waits on storage.
//
// Order is the point: an owner job runs after every checkpoint queued before
// it was posted. The owner posts a start's restore assembly only once the
// previous incarnation's reader has ended (conn.Finished), so the restore sees
// every checkpoint that incarnation sent, without the owner waiting for them.
type Worker[J any] struct {
	ckpts chan J // from the primary's frame reader; bounded by ckptGate's bytes too
	gate  *byteGate

	mu     sync.Mutex
	jobs   []func() // from the owner: never blocks it
	closed bool
	wake   chan struct{} // cap 1: jobs has work
	done   chan struct{} // closed by stop: drain and exit
	exited chan struct{} // closed when run returns
}

// NewWorker returns a worker whose checkpoint queue holds at most
// queueBytes (Queue, Release).
func NewWorker[J any](queueBytes int64) *Worker[J] {
	return &Worker[J]{
		ckpts:  make(chan J, 16),
		gate:   newByteGate(queueBytes),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
	}
}

// Post queues an owner job. It never blocks; after stop it drops the job
// and reports false.
func (w *Worker[J]) Post(job func()) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.jobs = append(w.jobs, job)
	select {
	case w.wake <- struct{}{}:
	default:
	}
	return true
}

// Run executes jobs until stop, then finishes what is queued. saveCkpt
// stores one checkpoint.
func (w *Worker[J]) Run(saveCkpt func(J)) {
	defer close(w.exited)
	for {
		select {
		case job := <-w.ckpts:
			saveCkpt(job)
		case <-w.wake:
			w.runJobs(saveCkpt)
		case <-w.done:
			w.runJobs(saveCkpt)
			w.drainCkpts(saveCkpt)
			return
		}
	}
}

// runJobs runs the owner's queued jobs, each after the checkpoints queued
// before it.
func (w *Worker[J]) runJobs(saveCkpt func(J)) {
	for {
		w.mu.Lock()
		if len(w.jobs) == 0 {
			w.mu.Unlock()
			return
		}
		job := w.jobs[0]
		w.jobs[0] = nil
		w.jobs = w.jobs[1:]
		w.mu.Unlock()
		w.drainCkpts(saveCkpt)
		job()
	}
}

func (w *Worker[J]) drainCkpts(saveCkpt func(J)) {
	for {
		select {
		case job := <-w.ckpts:
			saveCkpt(job)
		default:
			return
		}
	}
}

// Stop makes Run finish the queued work and return; it does not wait (see
// exited). Called once no reader can queue checkpoints any more.
func (w *Worker[J]) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.done)
	}
}

// Queue queues a checkpoint job of size bytes, waiting while the queue holds
// its bound (the agent's pipe fills: back-pressure). It reports false, and
// queues nothing, when cancel closes first.
func (w *Worker[J]) Queue(job J, size int64, cancel <-chan struct{}) bool {
	if _, ok := w.gate.acquire(size, cancel); !ok {
		return false
	}
	w.ckpts <- job
	return true
}

// Stopping is closed once Stop has been called: a wait for room in the
// queue that must not outlive the worker ends on it.
func (w *Worker[J]) Stopping() <-chan struct{} { return w.done }

// Release returns the bytes of a queued job once it has been handled.
func (w *Worker[J]) Release(size int64) { w.gate.release(size) }

// Exited is closed when Run has returned.
func (w *Worker[J]) Exited() <-chan struct{} { return w.exited }
