//! Two requests at once, each in its own workspace with its own uid: neither
//! can list, read or kill the other's files or processes, confined or not,
//! and one request's fork bomb, memory hog and disk fill leave the other's
//! commands working and the server's memory where it was.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{harness, Setup};
use skillhost_actors::sandbox::cgroups::{Cgroups, GroupLimits};
use skillhost_actors::sandbox::launch::SandboxMode;

/// Small enough that the hogs below pass it quickly.
const TEST_LIMITS: GroupLimits = GroupLimits { memory_bytes: 256 * 1024 * 1024, processes: 64 };
const TEST_SIZE_CAP: u64 = 32 * 1024 * 1024;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cannot_reach_each_other_confined_or_not() {
    for mode in [SandboxMode::Required, SandboxMode::Off] {
        let harness = harness(Setup { mode: Some(mode), ..Setup::default() }).await;
        let (a, a_path) = harness.workspace().await;
        let (b, _) = harness.workspace().await;
        let made = harness.shell(&a, "echo secret > secret.txt", 10_000).await;
        assert!(made.contains("[exit status 0]"), "{mode:?}: {made}");
        let a_path = a_path.display();
        for attempt in
            [format!("ls {a_path}"), format!("cat {a_path}/secret.txt"), format!("echo x > {a_path}/planted")]
        {
            let text = harness.shell(&b, &attempt, 10_000).await;
            assert!(!text.contains("[exit status 0]") && !text.contains("secret\n"), "{mode:?}: {attempt}: {text}");
        }
        // A's command runs while B tries to kill everything it can signal.
        let (slept, killed) = tokio::join!(harness.shell(&a, "sleep 3; echo survived", 20_000), async {
            tokio::time::sleep(Duration::from_millis(800)).await;
            harness.shell(&b, "kill -9 -1; pkill -9 sleep; true", 10_000).await
        });
        assert!(killed.contains("[exit status"), "{mode:?}: {killed}");
        assert!(slept.contains("survived\n[exit status 0]"), "{mode:?}: B's kill reached A: {slept}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_request_cannot_starve_another() {
    let cgroups = Cgroups::detect(TEST_LIMITS).expect("control groups: this test needs a root server on a host with the memory and pids controllers (cgroup v2 or v1)");
    let harness =
        harness(Setup { cgroups: Some(Arc::new(cgroups)), size_cap: Some(TEST_SIZE_CAP), ..Setup::default() }).await;
    let (a, _) = harness.workspace().await;
    let (b, _) = harness.workspace().await;
    let rss_before = common::memory("VmRSS");
    let hogs = [
        ("fork bomb", "bomb() { bomb | bomb & }; bomb; sleep 4", 8_000),
        (
            "memory hog",
            "for i in 1 2 3 4; do python3 -c 'b = bytearray(150 * 1024 * 1024); import time; time.sleep(4)' & done; wait",
            20_000,
        ),
        ("disk fill", "head -c 100M /dev/zero > fill; echo \"status $?\"", 20_000),
    ];
    for (what, hog, timeout) in hogs {
        let (hogged, other) = tokio::join!(harness.shell(&a, hog, timeout), async {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            harness.shell(&b, "echo still working > w.txt && cat w.txt", 30_000).await
        });
        assert!(
            other.contains("still working\n[exit status 0]"),
            "{what}: the other request's command failed: {other}"
        );
        match what {
            "memory hog" => assert!(hogged.contains("went past their memory limit"), "{what}: {hogged}"),
            "disk fill" => assert!(hogged.contains("No space left on device"), "{what}: {hogged}"),
            _ => {}
        }
        // A's own workspace still serves it afterwards.
        let again = harness.shell(&a, "rm -f fill; echo fine", 30_000).await;
        assert!(again.contains("fine\n[exit status 0]"), "{what}: {again}");
    }
    let grown = common::memory("VmRSS").saturating_sub(rss_before);
    assert!(grown < 64 * 1024 * 1024, "the server's memory grew by {grown} bytes");
}

/// Running commands and live workspaces share one sandbox memory: a
/// command's memory limit is lowered to what is left, and with less than
/// `MIN_COMMAND_MEMORY` left it is refused with the budget's sentence.
#[test]
fn commands_take_their_memory_from_the_sandbox_memory() {
    use skillhost_actors::sandbox::cgroups::MIN_COMMAND_MEMORY;
    use skillhost_actors::workspace::MemoryBudget;
    const MIB: u64 = 1024 * 1024;
    // A page short of room for a second command (the kernel keeps limits
    // in whole pages).
    const PAGE: u64 = 4096;
    let budget = MemoryBudget::new(TEST_LIMITS.memory_bytes + MIN_COMMAND_MEMORY - PAGE);
    let cgroups = Cgroups::detect(TEST_LIMITS)
        .expect("control groups: this test needs a root server on a host with the memory and pids controllers (cgroup v2 or v1)")
        .with_budget(Arc::clone(&budget));
    let limit_of = |group: &skillhost_actors::sandbox::cgroups::CommandGroup| -> u64 {
        group
            .dirs()
            .iter()
            .find_map(|dir| {
                ["memory.max", "memory.limit_in_bytes"]
                    .iter()
                    .find_map(|file| std::fs::read_to_string(dir.join(file)).ok())
            })
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    // The profile's whole limit fits: it is reserved while the group lives.
    let first = cgroups.create().unwrap();
    assert_eq!(limit_of(&first), TEST_LIMITS.memory_bytes);
    assert_eq!(budget.held(), TEST_LIMITS.memory_bytes);
    // A page short of the least a command gets: refused.
    let err = cgroups.create().unwrap_err().to_string();
    assert!(err.starts_with("the server's sandbox memory is full"), "{err}");
    drop(first);
    assert_eq!(budget.held(), 0);
    // With a workspace holding part of it, the next command gets the rest.
    let workspace = budget.reserve(TEST_LIMITS.memory_bytes - 100 * MIB).unwrap();
    let second = cgroups.create().unwrap();
    assert_eq!(limit_of(&second), 100 * MIB + MIN_COMMAND_MEMORY - PAGE);
    drop((second, workspace));
    assert_eq!(budget.held(), 0);
}
