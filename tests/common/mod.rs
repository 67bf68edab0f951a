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
