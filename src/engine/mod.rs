//! Database health and leadership: what the planner needs to order members and gate each stop
//! and return. `observe` talks to the database (I/O); the gate and ordering functions are pure.
//!
//! - [`generic`]: pod readiness, and an optional pod label that marks the leader.
//! - [`etcd`]: Raft-aware (one client per member endpoint, leader, raft index, alarms, MoveLeader).

use serde::{Deserialize, Serialize};

/// What one member looks like to the database engine at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct MemberHealth {
    /// Pod name of the member.
    pub pod: String,
    /// The member answered and reports itself healthy.
    pub healthy: bool,
    /// The member is the leader (engine-specific; always false for a leaderless generic set).
    pub leader: bool,
    /// Raft applied/commit index (etcd), to judge lag.
    pub raft_index: Option<u64>,
    /// Raft term as this member sees it (etcd).
    pub raft_term: Option<u64>,
    /// Engine-specific member id (etcd member id in hex).
    pub member_id: Option<String>,
    /// Why the member is not healthy, in words a human can act on.
    pub problem: Option<String>,
}

/// The database as seen by the engine: one entry per member pod that exists and has an IP,
/// plus cluster-wide problems (alarms, members that match no pod, learners...).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct HealthReport {
    pub members: Vec<MemberHealth>,
    /// Pod name of the leader all answering members agree on, if any.
    pub leader: Option<String>,
    /// Cluster-wide problems; non-empty means not healthy.
    pub problems: Vec<String>,
    /// Number of voting members the database itself knows (etcd member list), when known.
    pub voting_members: Option<usize>,
}

/// A gate's verdict: go on, or wait with a reason (shown in an Event and a condition).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gate {
    Open,
    Wait(String),
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot reach member {pod} at {endpoint}: {message}")]
    Unreachable {
        pod: String,
        endpoint: String,
        message: String,
    },
    #[error("leadership transfer from {from} to {to} failed: {message}")]
    LeaderTransfer {
        from: String,
        to: String,
        message: String,
    },
    #[error("cannot read secret {name}: {message}")]
    Secret { name: String, message: String },
    #[error("{0}")]
    Other(String),
}
