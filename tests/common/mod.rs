//! Test harness pieces shared by the integration tests that run on both backend sets.

use switchboard::broker::StreamNames;
use switchboard::config::Config;

/// Which backend set a test runs on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Backends {
    /// SQLite, the embedded queue, in-process counters.
    Embedded,
    /// The machine's PostgreSQL, NATS JetStream and Redis.
    Production,
}

/// Runs each named `async fn(Backends)` as two tests, `embedded::name` and
/// `production::name`.
#[macro_export]
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backends::Embedded).await } )*
        }
        mod production {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backends::Production).await } )*
        }
    };
}

/// Creates a fresh PostgreSQL database.
pub async fn create_database(name: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .expect("PostgreSQL must be running on 127.0.0.1:5432");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// Points `config` at `backends`; for production, at a fresh database, stream names,
/// worker consumer and counter key prefix of its own (`tag` tells whose they are).
pub async fn isolate(config: &mut Config, backends: Backends, tag: &str) {
    config.plugins.cache_dir = Some(std::env::temp_dir().join("switchboard-test-plugin-cache"));
    // The tests read `/metrics` on the API port; the default listener of its own
    // (127.0.0.1:9464) would clash between tests running side by side.
    config.metrics_listen = None;
    if backends == Backends::Embedded {
        *config = config.clone().embedded();
        return;
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let db = format!("sb_{tag}_{id}");
    create_database(&db).await;
    config.store.url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    config.store.max_connections = 8;
    config.broker.streams = StreamNames::isolated(&format!("{tag}{id}"));
    config.worker.consumer = format!("w{id}");
    config.counters.key_prefix = format!("sbtest:{id}:");
}

/// Makes the gateway's database refuse to record messages for `subscriber` (a trigger
/// that raises on insert): a row the database will not take, on either backend.
#[allow(dead_code)] // not every test binary uses it
pub async fn refuse_messages_for(config: &Config, subscriber: &str) {
    use sqlx::Connection;
    assert!(subscriber.chars().all(|c| c.is_ascii_alphanumeric()));
    if config.store.backend == switchboard::config::StoreBackend::Postgres {
        let mut conn = sqlx::PgConnection::connect(&config.store.url)
            .await
            .unwrap();
        for statement in [
            "CREATE OR REPLACE FUNCTION sb_test_refuse() RETURNS trigger AS $$ \
             BEGIN RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql"
                .to_string(),
            format!(
                "CREATE TRIGGER sb_test_refuse BEFORE INSERT ON messages FOR EACH ROW \
                 WHEN (NEW.subscriber_id = '{subscriber}') EXECUTE FUNCTION sb_test_refuse()"
            ),
        ] {
            sqlx::query(&statement).execute(&mut conn).await.unwrap();
        }
    } else {
        let path = config.data_dir.join("switchboard.db");
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        sqlx::query(&format!(
            "CREATE TRIGGER sb_test_refuse BEFORE INSERT ON messages \
             WHEN NEW.subscriber_id = '{subscriber}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
        ))
        .execute(&mut conn)
        .await
        .unwrap();
    }
}
