//! Which replica this process is, when several run behind a load balancer.
//!
//! Conversation workspaces and stored Responses live in one replica's
//! memory. Every id this process issues for them carries its replica id
//! after [`TAG`], so a request that names one and lands on another replica
//! is refused with a 409 naming the owner, never answered with a fresh,
//! empty conversation. The id is the process's identity, set once from
//! `--replica-id` before any request runs, so it is a process-wide value.

use std::sync::OnceLock;

/// Most characters of a replica id.
pub const MAX_REPLICA_ID_LEN: usize = 32;
/// Separates an issued id from the replica that issued it.
pub const TAG: &str = "__";
/// The cookie (and response header) that names the replica that answered;
/// a load balancer routes a client's later requests by it.
pub const COOKIE: &str = "skillhost_replica";
pub const HEADER: &str = "x-skillhost-replica";

static REPLICA: OnceLock<String> = OnceLock::new();

/// Checks a replica id: 1 to [`MAX_REPLICA_ID_LEN`] letters, digits or `-`
/// (what an id, a cookie value and a header value can all carry).
pub fn check(id: &str) -> Result<(), ReplicaIdError> {
    if id.is_empty() || id.len() > MAX_REPLICA_ID_LEN || !id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
        return Err(ReplicaIdError(id.to_string()));
    }
    Ok(())
}

/// A replica id that cannot travel in an id, a cookie and a header: the
/// server does not start with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--replica-id must be 1 to {MAX_REPLICA_ID_LEN} letters, digits or '-', got '{0}'")]
pub struct ReplicaIdError(pub String);

/// Names this process; only the first call counts.
pub fn set(id: &str) {
    let _ = REPLICA.set(id.to_string());
}

/// This process's replica id, when it has one.
pub fn this() -> Option<&'static str> {
    REPLICA.get().map(String::as_str)
}

/// `base` as an id this replica issues.
pub fn stamp(base: String) -> String {
    stamp_as(base, this())
}

fn stamp_as(base: String, replica: Option<&str>) -> String {
    match replica {
        Some(replica) => format!("{base}{TAG}{replica}"),
        None => base,
    }
}

/// The replica that issued `id`, when that is not this one.
pub fn elsewhere(id: &str) -> Option<&str> {
    elsewhere_as(id, this())
}

fn elsewhere_as<'a>(id: &'a str, replica: Option<&str>) -> Option<&'a str> {
    let (_, owner) = id.rsplit_once(TAG)?;
    (Some(owner) != replica).then_some(owner)
}

/// The sentence of the 409 for `what` (`conversation c-…`) owned by `owner`.
pub fn wrong_replica(what: &str, owner: &str) -> String {
    let here = this().map_or_else(|| "this server has no replica id".to_string(), |r| format!("this is replica {r}"));
    format!(
        "{what} lives on replica {owner}, and {here}: route its requests to {owner} (each replica names itself in the {COOKIE} cookie and the {HEADER} header), or leave the id out to start anew here"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_replica_and_only_another_one_is_elsewhere() {
        let id = stamp_as("c-00ff".into(), Some("r1"));
        assert_eq!(id, "c-00ff__r1");
        assert_eq!(elsewhere_as(&id, Some("r1")), None);
        assert_eq!(elsewhere_as(&id, Some("r2")), Some("r1"));
        assert_eq!(elsewhere_as(&id, None), Some("r1"));
        assert_eq!(elsewhere_as("c-00ff", Some("r2")), None);
        assert_eq!(stamp_as("resp_x".into(), None), "resp_x");
    }

    #[test]
    fn replica_ids_at_and_past_their_limits() {
        assert!(check(&"a".repeat(MAX_REPLICA_ID_LEN)).is_ok());
        assert!(check(&"a".repeat(MAX_REPLICA_ID_LEN + 1)).is_err());
        assert!(check("").is_err());
        assert!(check("r_1").is_err(), "an underscore would make the tag ambiguous");
        assert!(check("eu-west-1").is_ok());
    }
}
