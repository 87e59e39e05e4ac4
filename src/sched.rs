//! Keeping the HTTP and actor threads out of the way of decoding.
//!
//! llama.cpp decodes a token with every core in lock-step: its threads meet
//! at a barrier after each of the graph's ~900 operations. When an HTTP or
//! actor thread wakes to forward that token, the kernel's wakeup preemption
//! can push a decoding thread off its core, and every other decoding thread
//! then waits at the next barrier. Measured on 2 cores, that cost streaming
//! generation about 18% against a bare decode loop (`make bench`, row 1).
//! `SCHED_BATCH` keeps these threads' fair share of CPU but stops their
//! wakeups from preempting; it needs no privilege.

/// Marks the calling thread as batch work (Linux `SCHED_BATCH`).
pub fn mark_as_batch_work() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: `sched_setscheduler` with pid 0 changes only the calling thread
    // and reads `param`, which lives across the call.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if rc != 0 {
        tracing::debug!(error = %std::io::Error::last_os_error(), "cannot mark a thread as batch work");
    }
}
