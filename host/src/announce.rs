//! Announcements to every running process: a change written to the database is
//! followed at once instead of at the next poll.
//!
//! Two things are announced, each on a subject of its own:
//! - plugin swaps, on `broker.streams.plugins_subject` (default
//!   `switchboard.plugins.changed`; the payload is the slug): a process that hears one
//!   re-reads the active versions ([`crate::plugins::registry::Registry::sync`]);
//! - key revocations, on `broker.streams.revocations_subject` (default
//!   `switchboard.keys.revoked`; the payload is the hex SHA-256 of the key, never the
//!   key): a process that hears one refuses that key from then on
//!   ([`crate::auth::Authenticator::follow_revocations`]).
//!
//! In production an announcement is a core NATS message. The database stays the
//! source of truth: a lost or duplicated announcement costs nothing but latency, and
//! polling remains the safety net (a process that was disconnected, a change made
//! with the database alone).
//!
//! With the embedded broker (`dev`) there is one serving process: the announcement is
//! an in-process channel, and a change made by a second process (the CLI) is picked up
//! by polling.

use futures::StreamExt;
use futures::stream::BoxStream;
use std::time::Duration;

/// How long an announcement may take before it is left to polling.
const ANNOUNCE_DEADLINE: Duration = Duration::from_secs(3);

/// Where one kind of change is announced and heard.
#[derive(Clone)]
pub enum Announcer {
    /// Core NATS pub/sub on `subject`.
    Nats {
        /// The connection (shared with the broker in a serving process).
        client: async_nats::Client,
        /// The subject of this kind of change.
        subject: String,
    },
    /// Within this process only.
    Local(tokio::sync::broadcast::Sender<String>),
}

impl std::fmt::Debug for Announcer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Announcer::Nats { subject, .. } => write!(f, "Announcer::Nats({subject})"),
            Announcer::Local(_) => write!(f, "Announcer::Local"),
        }
    }
}

impl Announcer {
    /// An in-process announcer.
    pub fn local() -> Self {
        Announcer::Local(tokio::sync::broadcast::channel(64).0)
    }

    /// The announcer a short-lived process (the CLI) uses after a change, on
    /// `subject`: NATS when the broker is NATS and reachable within a few seconds,
    /// otherwise `None` (running processes then follow by polling).
    pub async fn connect(config: &crate::config::Config, subject: &str) -> Option<Self> {
        if config.broker.backend != crate::config::BrokerBackend::Nats {
            return None;
        }
        match crate::broker::nats::connect_client(config.broker.target(), "switchboard-cli").await {
            Ok(client) => Some(Announcer::Nats {
                client,
                subject: subject.to_string(),
            }),
            Err(e) => {
                tracing::warn!(error = %e, %subject, "cannot announce the change");
                None
            }
        }
    }

    /// Tells every listening process about `what` (a slug, a key digest). Best
    /// effort: a failure is logged, and polling picks the change up.
    ///
    /// Over NATS, every listener answers once it has applied the change
    /// ([`Heard::applied`]); this returns when the answers stop coming (no new one
    /// for [`QUIET`] after the first), so a request that reaches another running
    /// process after this returns finds the change applied there.
    pub async fn announce(&self, what: &str) {
        match self {
            Announcer::Nats { client, subject } => {
                let mut applied = 0usize;
                let sent = async {
                    let inbox = client.new_inbox();
                    let mut answers = client.subscribe(inbox.clone()).await?;
                    client
                        .publish_with_reply(subject.clone(), inbox, what.to_string().into())
                        .await?;
                    client.flush().await?;
                    // No serving process listens: the server says so at once.
                    let first = answers.next().await;
                    let nobody = |m: &async_nats::Message| {
                        m.status == Some(async_nats::StatusCode::NO_RESPONDERS)
                    };
                    if first.as_ref().is_some_and(|m| !nobody(m)) {
                        applied += 1;
                        while let Ok(Some(_)) = tokio::time::timeout(QUIET, answers.next()).await {
                            applied += 1;
                        }
                    }
                    let _ = answers.unsubscribe().await;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                };
                match tokio::time::timeout(ANNOUNCE_DEADLINE, sent).await {
                    Ok(Ok(())) => tracing::debug!(%subject, %what, applied, "announced"),
                    Ok(Err(e)) => {
                        tracing::warn!(%subject, error = %e, "not announced; processes follow by polling")
                    }
                    // Nobody listens (no serving process) or nobody answered in time.
                    Err(_) => {
                        tracing::debug!(%subject, applied, "announced; not every process answered")
                    }
                }
            }
            Announcer::Local(tx) => {
                // No receiver yet is fine: nobody to tell.
                let _ = tx.send(what.to_string());
            }
        }
    }

    /// What is announced from now on. Ends only when the process shuts down. After a
    /// gap (an in-process listener that fell behind) it yields an empty `what`: the
    /// listener re-reads everything.
    pub async fn subscribe(&self) -> anyhow::Result<BoxStream<'static, Heard>> {
        match self {
            Announcer::Nats { client, subject } => {
                let subscriber = client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|e| anyhow::anyhow!("subscribing to {subject}: {e}"))?;
                confirm_subscribed(client, subject).await;
                let client = client.clone();
                Ok(subscriber
                    .map(move |m| Heard {
                        what: String::from_utf8_lossy(&m.payload).into_owned(),
                        answer: m.reply.map(|to| (client.clone(), to)),
                    })
                    .boxed())
            }
            Announcer::Local(tx) => {
                let rx = tx.subscribe();
                Ok(futures::stream::unfold(rx, |mut rx| async move {
                    let what = match rx.recv().await {
                        Ok(what) => what,
                        // Missed some: the listener re-reads everything.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => String::new(),
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    };
                    Some((Heard { what, answer: None }, rx))
                })
                .boxed())
            }
        }
    }

    /// [`Announcer::subscribe`], or, when that fails, a warning that the change is
    /// left to `fallback` (a poll, a cache's TTL) and a stream that hears nothing.
    /// A process subscribes before it serves, so nothing announced after it answers
    /// its first request is missed.
    pub async fn heard_or_nothing(&self, fallback: &'static str) -> BoxStream<'static, Heard> {
        match self.subscribe().await {
            Ok(stream) => stream,
            Err(e) => {
                tracing::warn!(error = %e, "announcements not heard; {fallback}");
                futures::stream::pending().boxed()
            }
        }
    }
}

/// Waits (at most [`ANNOUNCE_DEADLINE`]) until the server has a subscription just made
/// on `client`: it handles one connection's commands in order, so once it answers a
/// request made after the subscription (nobody listens on a fresh inbox: it answers
/// "no responders"), the subscription is in place and nothing announced from then on is
/// missed. Writing the subscription out (a flush) would not say the server read it. On
/// a timeout (the connection is down) the subscription stands; the client makes it
/// again when it reconnects.
async fn confirm_subscribed(client: &async_nats::Client, subject: &str) {
    let answered = tokio::time::timeout(
        ANNOUNCE_DEADLINE,
        client.request(client.new_inbox(), bytes::Bytes::new()),
    )
    .await;
    match answered {
        Err(_) => {
            tracing::warn!(%subject, "the NATS server did not confirm the subscription in time")
        }
        Ok(Err(e)) if e.kind() != async_nats::RequestErrorKind::NoResponders => {
            tracing::warn!(%subject, error = %e, "the NATS server did not confirm the subscription")
        }
        Ok(_) => {}
    }
}

/// How long an announcer waits for one more listener's answer after the last.
pub const QUIET: Duration = Duration::from_millis(100);

/// One announcement, as a listener hears it.
pub struct Heard {
    /// The slug or key digest announced (empty after a gap: re-read everything).
    pub what: String,
    answer: Option<(async_nats::Client, async_nats::Subject)>,
}

impl Heard {
    /// Tells the announcer the change is applied in this process.
    pub async fn applied(self) {
        if let Some((client, to)) = self.answer
            && let Err(e) = client.publish(to, bytes::Bytes::new()).await
        {
            tracing::debug!(error = %e, "cannot answer an announcement");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_announcements_reach_every_subscriber() {
        let announcer = Announcer::local();
        announcer.announce("nobody-listens").await;
        let mut a = announcer.subscribe().await.unwrap();
        let mut b = announcer.subscribe().await.unwrap();
        announcer.announce("provc").await;
        assert_eq!(a.next().await.map(|h| h.what).as_deref(), Some("provc"));
        assert_eq!(b.next().await.map(|h| h.what).as_deref(), Some("provc"));
    }

    #[tokio::test]
    async fn nats_announcements_reach_another_connection() {
        let url = "nats://127.0.0.1:4222";
        let subject = format!("test{}.plugins.changed", uuid::Uuid::new_v4().simple());
        let connect = || async {
            async_nats::connect(url)
                .await
                .expect("NATS at 127.0.0.1:4222 (is it running?)")
        };
        let listener = Announcer::Nats {
            client: connect().await,
            subject: subject.clone(),
        };
        let speaker = Announcer::Nats {
            client: connect().await,
            subject,
        };
        // Announced the moment the subscription is made, from another connection:
        // heard only if `subscribe` returns once the server has the subscription.
        let subscribing = std::time::Instant::now();
        let mut heard = listener.subscribe().await.unwrap();
        assert!(
            subscribing.elapsed() < ANNOUNCE_DEADLINE,
            "the server's answer confirms the subscription, not the deadline"
        );
        speaker.announce("provd").await;
        let slug = tokio::time::timeout(Duration::from_secs(5), heard.next())
            .await
            .expect("announcement heard within 5 s");
        assert_eq!(slug.map(|h| h.what).as_deref(), Some("provd"));
    }

    #[tokio::test]
    async fn the_cli_announces_only_over_nats() {
        let mut config = crate::config::Config::default();
        config.broker.backend = crate::config::BrokerBackend::Embedded;
        let subject = "switchboard.plugins.changed";
        assert!(Announcer::connect(&config, subject).await.is_none());
        config.broker.backend = crate::config::BrokerBackend::Nats;
        config.broker.url = "nats://127.0.0.1:1".into();
        assert!(
            Announcer::connect(&config, subject).await.is_none(),
            "unreachable"
        );
        config.broker.url = "nats://127.0.0.1:4222".into();
        assert!(matches!(
            Announcer::connect(&config, subject).await,
            Some(Announcer::Nats { .. })
        ));
    }
}
