package supervisor

import "sync"

// storeWorker is the stores' one worker goroutine. It runs, one at a time,
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
type storeWorker struct {
	ckpts chan ckptJob // from the primary's frame reader; bounded by ckptGate's bytes too
	gate  *byteGate

	mu     sync.Mutex
	jobs   []func() // from the owner: never blocks it
	closed bool
	wake   chan struct{} // cap 1: jobs has work
	done   chan struct{} // closed by stop: drain and exit
	exited chan struct{} // closed when run returns
}

func newStoreWorker(queueBytes int64) *storeWorker {
	return &storeWorker{
		ckpts:  make(chan ckptJob, 16),
		gate:   newByteGate(queueBytes),
		wake:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		exited: make(chan struct{}),
	}
}

// post queues an owner job. It never blocks; after stop it drops the job
// and reports false.
func (w *storeWorker) post(job func()) bool {
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

// run executes jobs until stop, then finishes what is queued. saveCkpt
// stores one checkpoint.
func (w *storeWorker) run(saveCkpt func(ckptJob)) {
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
func (w *storeWorker) runJobs(saveCkpt func(ckptJob)) {
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

func (w *storeWorker) drainCkpts(saveCkpt func(ckptJob)) {
	for {
		select {
		case job := <-w.ckpts:
			saveCkpt(job)
		default:
			return
		}
	}
}

// stop makes run finish the queued work and return; it does not wait (see
// exited). Called once no reader can queue checkpoints any more.
func (w *storeWorker) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.closed {
		w.closed = true
		close(w.done)
	}
}
