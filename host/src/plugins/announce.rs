//! Announcing plugin swaps, so every running process follows an install, upgrade or
//! rollback at once instead of at its next poll of the database.
//!
//! In production the announcement is a core NATS message on
//! `broker.streams.plugins_subject` (default `switchboard.plugins.changed`; the payload
//! is the slug). It carries no state: a process that hears it re-reads the active
//! versions from the database ([`super::registry::Registry::sync`]), so a lost or
//! duplicated announcement costs nothing but latency, and polling every
//! `plugins.sync_ms` remains the safety net (a process that was disconnected, a swap
//! made with the database alone).
//!
//! With the embedded broker (`dev`) there is one serving process: the announcement is
//! an in-process channel, and an install from a second process (the CLI) is picked up
//! by polling.

use futures::StreamExt;
use futures::stream::BoxStream;
use std::time::Duration;

/// How long an announcement may take before it is left to polling.
const ANNOUNCE_DEADLINE: Duration = Duration::from_secs(3);

/// Where swaps are announced and heard.
#[derive(Clone)]
pub enum Announcer {
    /// Core NATS pub/sub on `subject`.
    Nats {
        /// The connection (shared with the broker in a serving process).
        client: async_nats::Client,
        /// `broker.streams.plugins_subject`.
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

    /// The announcer a short-lived process (the CLI) uses after changing the active
    /// versions: NATS when the broker is NATS and reachable within a few seconds,
    /// otherwise `None` (running processes then follow by polling).
    pub async fn connect(config: &crate::config::Config) -> Option<Self> {
        if config.broker.backend != crate::config::BrokerBackend::Nats {
            return None;
        }
        match crate::broker::jetstream::connect_client(&config.broker.url, "switchboard-cli").await
        {
            Ok(client) => Some(Announcer::Nats {
                client,
                subject: config.broker.streams.plugins_subject.clone(),
            }),
            Err(e) => {
                tracing::warn!(error = %e, "cannot announce the plugin swap");
                None
            }
        }
    }

    /// Tells every listening process that `slug`'s active version changed. Best
    /// effort: a failure is logged, and polling picks the change up.
    pub async fn announce(&self, slug: &str) {
        match self {
            Announcer::Nats { client, subject } => {
                let sent = async {
                    client
                        .publish(subject.clone(), slug.to_string().into())
                        .await?;
                    client.flush().await?;
                    Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
                };
                match tokio::time::timeout(ANNOUNCE_DEADLINE, sent).await {
                    Ok(Ok(())) => tracing::debug!(%slug, "plugin swap announced"),
                    Ok(Err(e)) => {
                        tracing::warn!(%slug, error = %e, "plugin swap not announced; processes follow by polling")
                    }
                    Err(_) => {
                        tracing::warn!(%slug, "plugin swap not announced (timed out); processes follow by polling")
                    }
                }
            }
            Announcer::Local(tx) => {
                // No receiver yet is fine: nobody to tell.
                let _ = tx.send(slug.to_string());
            }
        }
    }

    /// The slugs announced from now on. Ends only when the process shuts down.
    pub async fn subscribe(&self) -> anyhow::Result<BoxStream<'static, String>> {
        match self {
            Announcer::Nats { client, subject } => {
                let subscriber = client
                    .subscribe(subject.clone())
                    .await
                    .map_err(|e| anyhow::anyhow!("subscribing to {subject}: {e}"))?;
                Ok(subscriber
                    .map(|m| String::from_utf8_lossy(&m.payload).into_owned())
                    .boxed())
            }
            Announcer::Local(tx) => {
                let rx = tx.subscribe();
                Ok(futures::stream::unfold(rx, |mut rx| async move {
                    match rx.recv().await {
                        Ok(slug) => Some((slug, rx)),
                        // Missed some: any slug will do, the sync reads everything.
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                            Some((String::new(), rx))
                        }
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => None,
                    }
                })
                .boxed())
            }
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
        assert_eq!(a.next().await.as_deref(), Some("provc"));
        assert_eq!(b.next().await.as_deref(), Some("provc"));
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
        let mut heard = listener.subscribe().await.unwrap();
        let speaker = Announcer::Nats {
            client: connect().await,
            subject,
        };
        speaker.announce("provd").await;
        let slug = tokio::time::timeout(Duration::from_secs(5), heard.next())
            .await
            .expect("announcement heard within 5 s");
        assert_eq!(slug.as_deref(), Some("provd"));
    }

    #[tokio::test]
    async fn the_cli_announces_only_over_nats() {
        let mut config = crate::config::Config::default();
        config.broker.backend = crate::config::BrokerBackend::Embedded;
        assert!(Announcer::connect(&config).await.is_none());
        config.broker.backend = crate::config::BrokerBackend::Nats;
        config.broker.url = "nats://127.0.0.1:1".into();
        assert!(Announcer::connect(&config).await.is_none(), "unreachable");
        config.broker.url = "nats://127.0.0.1:4222".into();
        assert!(matches!(
            Announcer::connect(&config).await,
            Some(Announcer::Nats { .. })
        ));
    }
}
