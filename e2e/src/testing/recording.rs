//! A background watch that records what it sees, from its first list on: a test starts it
//! before the step it watches and reads, after the step, everything that happened meanwhile,
//! however briefly an object lived (a poll would miss one created and deleted between two
//! looks).

use std::fmt::Debug;
use std::time::Duration;

use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::oneshot;

/// One thing the watch saw.
#[derive(Debug)]
pub enum Seen<K> {
    /// An object listed, created or changed.
    Applied(K),
    /// An object deleted.
    Deleted(K),
    /// The watch had to list again after its first list (a deletion may have been missed).
    Relisted,
    /// The watch failed (it backs off and goes on).
    Error(String),
}

/// A running watch and the task that folds what it sees into a `T`.
pub struct Recording<T> {
    what: String,
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<T>,
}

impl<T: Send + 'static> Recording<T> {
    /// Starts a watch of `api` (with `config`, e.g. a label selector) that folds each thing it
    /// sees into `state` with `record`, and returns once its first list is in (at most a
    /// minute): every later change reaches it. `what` names it in failures.
    pub async fn start<K>(
        api: Api<K>,
        config: watcher::Config,
        what: &str,
        mut state: T,
        mut record: impl FnMut(&mut T, Seen<K>) + Send + 'static,
    ) -> Self
    where
        K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    {
        let (listed_tx, listed_rx) = oneshot::channel();
        let (stop, mut stop_rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut stream = watcher::watcher(api, config).default_backoff().boxed();
            let mut listed = Some(listed_tx);
            loop {
                let event = tokio::select! {
                    _ = &mut stop_rx => break,
                    event = stream.next() => event,
                };
                let seen = match event {
                    None => break,
                    Some(Err(e)) => Seen::Error(e.to_string()),
                    Some(Ok(watcher::Event::Init)) => continue,
                    Some(Ok(watcher::Event::InitDone)) => match listed.take() {
                        Some(tx) => {
                            let _ = tx.send(());
                            continue;
                        }
                        None => Seen::Relisted,
                    },
                    Some(Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o))) => {
                        Seen::Applied(o)
                    }
                    Some(Ok(watcher::Event::Delete(o))) => Seen::Deleted(o),
                };
                record(&mut state, seen);
            }
            state
        });
        tokio::time::timeout(Duration::from_secs(60), listed_rx)
            .await
            .unwrap_or_else(|_| panic!("the {what} watch lists within a minute"))
            .unwrap_or_else(|_| panic!("the {what} watch task lives"));
        Recording {
            what: what.to_string(),
            stop,
            task,
        }
    }

    /// Stops the watch (within 10 s): what it recorded.
    pub async fn finish(self) -> T {
        let _ = self.stop.send(());
        let what = self.what;
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .unwrap_or_else(|_| panic!("the {what} watch stops"))
            .unwrap_or_else(|e| panic!("the {what} watch did not panic: {e}"))
    }
}
