//! Tasks that end with their owner.

use tokio::task::JoinHandle;

/// A task aborted when its handle is dropped: a killed loop must not leave
/// its relay (and so its engine sequence) or its tool calls running, nor a
/// stopped actor its timers.
pub struct AbortOnDrop(JoinHandle<()>);

impl AbortOnDrop {
    pub fn new(task: JoinHandle<()>) -> AbortOnDrop {
        AbortOnDrop(task)
    }
}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
