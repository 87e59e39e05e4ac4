//! The step turn: on a CPU build, one engine of the process runs a step at
//! a time (the chat executor's steps and the embedding batches alike).

/// One engine steps at a time in the process, on the CPU. Each step's
/// graph runs on ggml's threads across every core and waits at a barrier
/// after each operation by spinning; two engines stepping at once (two
/// models) put twice the spinning threads on the cores, and one whose
/// thread is descheduled holds up the other's barriers: two models at
/// once fell to 0.10x of one at a time. Holding the turn over the whole
/// step (sampling too, which would otherwise take a core from the other's
/// graph) gives 0.94x (`skillhost-bench models`). A GPU build runs its
/// graphs on the device and takes no turn.
static STEP_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes the step turn (see [`STEP_TURN`]) on a CPU build; `None` on a GPU
/// build. Held until dropped.
pub(crate) fn step_turn() -> Option<std::sync::MutexGuard<'static, ()>> {
    (!crate::GPU_BUILD).then(|| STEP_TURN.lock().unwrap_or_else(|poisoned| poisoned.into_inner()))
}
