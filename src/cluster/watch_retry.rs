//! How every watch of the operator goes on after a failure ([`retried`]).
//!
//! kube-runtime's default backoff (0.8 s doubling to 30 s, reset only by an event or after two
//! quiet minutes) grows through an API server outage, and the first answer of a server that is
//! back is often a `410 Gone` (the resumed watch is older than the new server's cache), after
//! which that backoff waited once more before the new list. So each watch stayed down for up
//! to a minute after the server was back, one after the other: the requests it wakes were not
//! woken, and what the read caches kept of its kind was used meanwhile (now they read through
//! while a watch is down: [`super::ReadCache`], [`super::VolumeCache`]). Measured on the local
//! cluster: a member whose copy an API server restart hit was down 56 to 90 s instead of 3 to
//! 6 s.
//!
//! Here a failure pauses the watch 0.25 s, doubling to at most [`WATCH_RETRY_MAX`] (5 s, with
//! jitter), and a `410 Gone` lists anew at once, unless the failure before it was one too. One
//! operator's watches, a dozen or so, each retrying every few seconds at most, are no load for
//! a server coming back.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::{Stream, StreamExt};
use kube::runtime::watcher;

/// The first pause after a watch's failure.
pub const WATCH_RETRY_MIN: Duration = Duration::from_millis(250);
/// The longest pause between two attempts of a failing watch: the pauses double up to half of
/// it, and the jitter adds up to as much again.
pub const WATCH_RETRY_MAX: Duration = Duration::from_secs(5);

/// The pauses of one watch ([`retried`]): pure but for the jitter.
#[derive(Debug)]
pub struct WatchRetry {
    delays: ExponentialBackoff,
    /// Whether the last failure was a `410 Gone`.
    last_gone: bool,
}

impl Default for WatchRetry {
    fn default() -> Self {
        Self {
            delays: delays(),
            last_gone: false,
        }
    }
}

fn delays() -> ExponentialBackoff {
    ExponentialBuilder::new()
        .with_min_delay(WATCH_RETRY_MIN)
        .with_max_delay(WATCH_RETRY_MAX / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

impl WatchRetry {
    /// The pause before the watch goes on after `error`: none after a first `410 Gone` (the
    /// server answered: the watcher lists anew), else the next of the growing pauses.
    pub fn after(&mut self, error: &watcher::Error) -> Duration {
        let gone = is_gone(error);
        let first_gone = gone && !self.last_gone;
        self.last_gone = gone;
        if first_gone {
            return Duration::ZERO;
        }
        self.delays.next().unwrap_or(WATCH_RETRY_MAX)
    }

    /// The watch reported an event: the next failure starts from the shortest pause.
    pub fn reset(&mut self) {
        *self = Self::default();
    }
}

/// Whether `error` is the server's `410 Gone` in a watch: the watcher lists anew after it.
pub fn is_gone(error: &watcher::Error) -> bool {
    matches!(error, watcher::Error::WatchError(status) if status.code == 410)
}

/// `watch`, with a pause after each failure ([`WatchRetry`]). The failure itself is passed on
/// at once (the read caches stop using what they keep of the kind); the pause comes before the
/// watch is polled again.
pub fn retried<S, T>(watch: S) -> impl Stream<Item = Result<T, watcher::Error>> + Send + 'static
where
    S: Stream<Item = Result<T, watcher::Error>> + Send + 'static,
    T: Send + 'static,
{
    let state = (watch.boxed(), WatchRetry::default(), Duration::ZERO);
    futures::stream::unfold(state, |(mut watch, mut retry, pause)| async move {
        if !pause.is_zero() {
            tokio::time::sleep(pause).await;
        }
        let item = watch.next().await?;
        let pause = match &item {
            Ok(_) => {
                retry.reset();
                Duration::ZERO
            }
            Err(e) => retry.after(e),
        };
        Some((item, (watch, retry, pause)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gone() -> watcher::Error {
        let mut status = kube::core::Status::failure("too old resource version", "Expired");
        status.code = 410;
        watcher::Error::WatchError(Box::new(status))
    }

    fn refused() -> watcher::Error {
        watcher::Error::NoResourceVersion
    }

    #[test]
    fn a_first_gone_lists_again_at_once_a_second_waits() {
        let mut retry = WatchRetry::default();
        assert_eq!(retry.after(&gone()), Duration::ZERO);
        let second = retry.after(&gone());
        assert!(second > Duration::ZERO && second <= WATCH_RETRY_MAX);
        assert!(retry.after(&refused()) > Duration::ZERO);
        // After another failure, a gone is a first one again.
        assert_eq!(retry.after(&gone()), Duration::ZERO);
    }

    #[test]
    fn pauses_grow_to_a_few_seconds_and_start_over_after_an_event() {
        let mut retry = WatchRetry::default();
        let pauses: Vec<Duration> = (0..12).map(|_| retry.after(&refused())).collect();
        assert!(pauses[0] >= WATCH_RETRY_MIN && pauses[0] <= WATCH_RETRY_MIN * 2);
        assert!(pauses.iter().all(|p| *p <= WATCH_RETRY_MAX), "{pauses:?}");
        assert!(pauses[11] >= WATCH_RETRY_MAX / 2, "{pauses:?}");
        retry.reset();
        assert!(retry.after(&refused()) <= WATCH_RETRY_MIN * 2);
    }

    #[test]
    fn only_a_watch_error_410_is_gone() {
        assert!(is_gone(&gone()));
        assert!(!is_gone(&refused()));
        let mut other = kube::core::Status::failure("internal", "InternalError");
        other.code = 500;
        assert!(!is_gone(&watcher::Error::WatchError(Box::new(other))));
    }

    #[tokio::test(start_paused = true)]
    async fn a_failure_is_passed_on_at_once_and_the_pause_comes_after() {
        let events: Vec<Result<u32, watcher::Error>> =
            vec![Err(refused()), Ok(1), Err(gone()), Ok(2)];
        let start = tokio::time::Instant::now();
        let mut seen = Vec::new();
        let stream = retried(futures::stream::iter(events));
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            seen.push((item.is_ok(), start.elapsed()));
        }
        assert_eq!(seen[0], (false, Duration::ZERO));
        // The pause after the refusal, before the next event.
        assert!(seen[1].0 && seen[1].1 >= WATCH_RETRY_MIN, "{seen:?}");
        // No pause after a first gone.
        assert_eq!(seen[3], (true, seen[2].1));
    }
}
