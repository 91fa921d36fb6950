//! The handover by dynamic reconfiguration (`handover: Reconfig`). ZooKeeper has no command
//! that moves leadership, but a leader that a committed `reconfig` leaves without a vote hands
//! it to a synced voter it designates, without an election (`Leader.getDesignatedLeader`). So:
//!
//! 1. the leader's `server.N=` line is re-added with the role `observer`: ZooKeeper designates
//!    another leader, and the old one follows it as an observer;
//! 2. once another member leads, the line is re-added with the role `participant`: the old
//!    leader votes again, as a follower, and may stop like any follower.
//!
//! Each look reads `/zookeeper/config` and asks `srvr` of every member again, and the next step
//! is the pure [`reconfig_step`] of what it saw, so a handover cut short (the operator
//! restarted, a session lost) goes on from where it stands when asked again. Every `reconfig`
//! carries the version of the configuration just read as its precondition. A session is made
//! to the members other than the leader (the leader's own sessions close when it steps down),
//! with the request's digest auth when it names one.
//!
//! Whether the ensemble allows reconfiguration is asked by a `reconfig` that no ensemble can
//! apply (its precondition is a version none has): ZooKeeper checks `reconfigEnabled` first and
//! answers `ReconfigDisabled`, else refuses the version; nothing changes either way.

use std::time::Duration;

use tokio::time::{Instant, timeout};
use tracing::{info, instrument};
use zookeeper_client as zk;

use super::{WORD_TIMEOUT, ZooKeeperClient, four_letter_word};
use crate::engine::HealthReport;
use crate::engine::zookeeper::{
    EnsembleConfig, Mode, RECONFIG_SETTING, ReconfigStep, ServerRole, parse_srvr, reconfig_step,
};

/// Bound on a whole handover: both reconfigurations and the looks between them.
const HANDOVER_TIMEOUT: Duration = Duration::from_secs(30);
/// The session's timeout on the server (one session per look, closed after it).
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a handover looks again while it waits.
const LOOK_EVERY: Duration = Duration::from_millis(200);
/// A configuration version no ensemble has (the probe's precondition).
const PROBE_VERSION: i64 = i64::MAX;

/// What one look saw: the configuration, and each member's mode.
struct Look {
    config: EnsembleConfig,
    modes: Vec<(String, Option<Mode>)>,
}

impl ZooKeeperClient {
    /// A session to `endpoints` (`ip:port`), with the request's digest auth.
    async fn session(&self, endpoints: &[String]) -> Result<zk::Client, String> {
        let mut connector = zk::Client::connector()
            .with_session_timeout(SESSION_TIMEOUT)
            .with_connection_timeout(WORD_TIMEOUT)
            .with_fail_eagerly();
        if let Some(a) = &self.auth {
            let secret = format!("{}:{}", a.user, a.password);
            connector = connector.with_auth("digest", secret.as_bytes());
        }
        let cluster = endpoints.join(",");
        match timeout(WORD_TIMEOUT * 2, connector.connect(&cluster)).await {
            Ok(Ok(c)) => Ok(c),
            Ok(Err(e)) => Err(format!("no session to {cluster}: {e}")),
            Err(_) => Err(format!("no session to {cluster}: timed out")),
        }
    }

    /// Err (a problem for the report) when the ensemble refuses reconfiguration, or cannot be
    /// asked.
    pub(super) async fn reconfig_allowed(&self, endpoints: &[String]) -> Result<(), String> {
        let unknown = |e: String| format!("whether the ensemble allows reconfiguration: {e}");
        let session = self.session(endpoints).await.map_err(unknown)?;
        let probe = session.update_ensemble(
            zk::EnsembleUpdate::Incremental {
                joinings: Vec::<&str>::new().into_iter(),
                leavings: Vec::<&str>::new().into_iter(),
            },
            Some(PROBE_VERSION),
        );
        match timeout(WORD_TIMEOUT, probe).await {
            Ok(Err(zk::Error::ReconfigDisabled)) => Err(format!(
                "the ensemble refuses reconfiguration, which handover: Reconfig needs: set \
                 {RECONFIG_SETTING} in zoo.cfg, or use handover: Election"
            )),
            Ok(Err(zk::Error::ConnectionLoss | zk::Error::SessionExpired)) | Err(_) => {
                Err(unknown("no answer".to_string()))
            }
            // Refused for its version (or, in theory, applied: it changes no server).
            Ok(_) => Ok(()),
        }
    }

    /// Hands leadership from `from` by reconfiguration (see the module doc); Ok once `from` is
    /// a participant following another leader. `to` is not asked for: ZooKeeper designates
    /// the new leader.
    #[instrument(skip_all, fields(from))]
    pub(super) async fn hand_over_by_reconfig(
        &self,
        report: &HealthReport,
        from: &str,
    ) -> Result<(), String> {
        if self.handover != crate::api::ZooKeeperHandover::Reconfig {
            return Err("handover: Election asks for no handover".to_string());
        }
        let members: Vec<(String, String)> = (report.members.iter())
            .filter_map(|m| Some((m.pod.clone(), m.endpoint.clone()?)))
            .collect();
        let others: Vec<String> = (members.iter())
            .filter(|(pod, _)| pod != from)
            .map(|(_, e)| e.clone())
            .collect();
        let from_ip = (members.iter())
            .find(|(pod, _)| pod == from)
            .and_then(|(_, e)| e.rsplit_once(':'))
            .map(|(ip, _)| ip.trim_matches(|c| c == '[' || c == ']').to_string());
        let deadline = Instant::now() + HANDOVER_TIMEOUT;
        let mut last = String::from("not looked yet");
        while Instant::now() < deadline {
            match self
                .handover_step(&members, &others, from, from_ip.as_deref())
                .await
            {
                Ok(ReconfigStep::Done) => return Ok(()),
                Ok(ReconfigStep::Wait(why)) => last = why,
                Ok(step) => last = format!("{step:?} asked"),
                Err(Fatal(why)) => return Err(why),
                Err(Again(why)) => last = why,
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
        Err(format!(
            "not handed over within {} s: {last}",
            HANDOVER_TIMEOUT.as_secs()
        ))
    }

    /// One look, and the reconfiguration it calls for.
    async fn handover_step(
        &self,
        members: &[(String, String)],
        others: &[String],
        from: &str,
        from_ip: Option<&str>,
    ) -> Result<ReconfigStep, StepError> {
        let session = self.session(others).await.map_err(Again)?;
        let look = look(&session, members).await.map_err(Again)?;
        let line = (look.config.server_of(from, from_ip)).map_err(Fatal)?;
        let mode = (look.modes.iter())
            .find(|(p, _)| p == from)
            .and_then(|(_, m)| m.as_ref());
        let other_leader = (look.modes.iter())
            .find(|(p, m)| p != from && m.as_ref() == Some(&Mode::Leader))
            .map(|(p, _)| p.as_str());
        let step = reconfig_step(line.role, mode, other_leader);
        let role = match step {
            ReconfigStep::MakeObserver => ServerRole::Observer,
            ReconfigStep::MakeParticipant => ServerRole::Participant,
            _ => return Ok(step),
        };
        let joining = line.with_role(role, self.port);
        info!(%joining, version = look.config.version, "reconfig");
        let update = session.update_ensemble(
            zk::EnsembleUpdate::Incremental {
                joinings: vec![joining.as_str()].into_iter(),
                leavings: Vec::<&str>::new().into_iter(),
            },
            Some(look.config.version),
        );
        match timeout(WORD_TIMEOUT * 2, update).await {
            Ok(Ok(_)) => Ok(step),
            Ok(Err(e @ (zk::Error::NoAuth | zk::Error::ReconfigDisabled))) => Err(Fatal(format!(
                "reconfig {joining} refused: {e} (the auth Secret must be ZooKeeper's super user, \
                 or a user the ACL of /zookeeper/config lets write; or the ensemble runs with \
                 skipACL=yes)"
            ))),
            // Another change came first, the quorum is busy, or the answer was lost: look again.
            Ok(Err(e)) => Err(Again(format!("reconfig {joining}: {e}"))),
            Err(_) => Err(Again(format!("reconfig {joining}: no answer"))),
        }
    }
}

/// Why a step did not happen: `Again` looks again, `Fatal` ends the handover.
enum StepError {
    Again(String),
    Fatal(String),
}
use StepError::{Again, Fatal};

/// The configuration through `session`, and every member's `srvr` mode.
async fn look(session: &zk::Client, members: &[(String, String)]) -> Result<Look, String> {
    let (data, _) = match timeout(WORD_TIMEOUT, session.get_config()).await {
        Ok(Ok(config)) => config,
        Ok(Err(e)) => return Err(format!("read /zookeeper/config: {e}")),
        Err(_) => return Err("read /zookeeper/config: no answer".to_string()),
    };
    let config = EnsembleConfig::parse(&String::from_utf8_lossy(&data))?;
    let modes = futures::future::join_all(members.iter().map(|(pod, endpoint)| async move {
        let mode = four_letter_word(endpoint, "srvr")
            .await
            .and_then(|t| parse_srvr(&t))
            .ok()
            .map(|s| s.mode);
        (pod.clone(), mode)
    }))
    .await;
    Ok(Look { config, modes })
}
