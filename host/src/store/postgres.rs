//! The PostgreSQL store (sqlx): its pool, its group commit, and what every
//! aggregate's PostgreSQL file shares (error mapping, intervals, JSON binds).
//!
//! Queries are plain `sqlx::query` with binds (no compile-time checking: there is no
//! database at build time). Batches are written with `UNNEST` over array binds: one
//! statement per chunk whatever the batch size, well clear of the 65,535-bind limit.

use super::coalesce::Coalescer;
use super::delivery::{self, Batches, ClaimRequest, StepRequest};
use super::group::{GroupCommit, Grouped, Lanes};
use super::outbound::{self, EndpointHealth, LeaseRequest, LogRequest, OutboundBatches};
use super::receipts::{self, ReceiptBatches};
use super::{Store, StoreError};
use crate::model::Claim;
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use crate::tls::TlsFiles;
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{PgConnection, Postgres};
use std::sync::Arc;
use std::time::Duration;

/// How long to wait for a pooled connection (or a new one) before reporting the
/// database unavailable: short, so that health checks and requests fail fast.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Longest interval bound in SQL (1,000 years): a larger lease or audit window would
/// push `now() ± interval` out of PostgreSQL's timestamp range.
const MAX_INTERVAL_MICROS: i64 = 1_000 * 366 * 86_400 * 1_000_000;

/// Opens every group-commit batch: a write waiting longer than this on a row lock fails
/// alone (its caller retries it) rather than hold up its batch. And every statement is
/// planned for its own arguments: a generic plan made while a new database's tables
/// were small (a plan is made once per connection) scanned them whole for ever after,
/// and most writes of the lanes were never checked against that. The delivery path's
/// batches, which were, run on plans made once ([`key_plans`]). One simple query.
const LANE_BEGIN: &str =
    "BEGIN; SET LOCAL lock_timeout = '2s'; SET LOCAL plan_cache_mode = force_custom_plan";

/// [`key_plans`] on: plans made once per connection and statement, which can only look
/// rows up by key (no whole-table scans, no hash or merge joins), so a plan made while
/// the tables were empty stays right as they grow.
const KEY_PLANS_ON: &str = "SET LOCAL plan_cache_mode = force_generic_plan; \
     SET LOCAL enable_seqscan = off; SET LOCAL enable_hashjoin = off; \
     SET LOCAL enable_mergejoin = off";

/// [`key_plans`] off: back to [`LANE_BEGIN`]'s settings for the rest of the batch.
const KEY_PLANS_OFF: &str = "SET LOCAL plan_cache_mode = force_custom_plan; \
     SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL enable_hashjoin TO DEFAULT; \
     SET LOCAL enable_mergejoin TO DEFAULT";

/// Runs the delivery path's batches (claims, steps, receipts) on plans made once per
/// connection instead of planning every statement afresh, which took a quarter of the
/// server's CPU in a delivery run (`docs/benchmarks.md`). Every statement they run
/// looks rows up by a batch's keys; the joins over those keys start from the keys
/// (`LATERAL` where the planner could otherwise start from the table), and a test
/// checks their plans made on empty tables. `on` before the batch's statements, `off`
/// after them, inside the batch's transaction: a batch that fails is rolled back (to
/// its savepoint) with the settings.
pub(crate) async fn key_plans(conn: &mut PgConnection, on: bool) -> Result<(), StoreError> {
    let settings = if on { KEY_PLANS_ON } else { KEY_PLANS_OFF };
    // A query without arguments: one simple query, its statements in one round trip.
    sqlx::Executor::execute(conn, settings)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Lanes committing delivery writes in parallel: each holds one connection while it
/// commits, so concurrent batches keep the server busy without taking the pool.
const GROUP_LANES: usize = 4;

/// The group commit's lanes: [`GROUP_LANES`] of them, each batch opened with
/// [`LANE_BEGIN`]; a write that runs alone opens a plain `BEGIN` (no lock timeout).
const LANES: Lanes = Lanes {
    count: GROUP_LANES,
    begin: Some(LANE_BEGIN),
    alone_begin: None,
    map_err,
    // Its queues are elsewhere (JetStream): an ack could outlive the progress it follows.
    flush: None,
};

/// The PostgreSQL store: a connection pool, and the group commit of the delivery path.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    group: Arc<GroupCommit<Postgres>>,
    claims: Arc<Coalescer<ClaimRequest, Claim>>,
    steps: Arc<Coalescer<StepRequest, ()>>,
    receipts: Arc<Coalescer<ReceiptWrite, ReceiptOutcome>>,
    leases: Arc<Coalescer<LeaseRequest, bool>>,
    logs: Arc<Coalescer<LogRequest, Option<EndpointHealth>>>,
}

impl PgStore {
    /// Connects to `url` (`postgres://user:pass@host:port/db`) with a pool of at most
    /// `max_connections`, opening one connection now so that a wrong URL or a database
    /// that is down is reported at start-up (as [`StoreError::Unavailable`] within a
    /// few seconds when the server cannot be reached).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        Self::connect_tls(url, max_connections, &TlsFiles::default()).await
    }

    /// [`PgStore::connect`] with TLS files (`store.tls`): the CA verifies the server, a
    /// client certificate is presented when set. A CA with no `sslmode` in the URL means
    /// `verify-full`, since a CA given only to be ignored would be a surprise.
    pub async fn connect_tls(
        url: &str,
        max_connections: u32,
        tls: &TlsFiles,
    ) -> Result<Self, StoreError> {
        let mut options: PgConnectOptions = url.parse().map_err(map_err)?;
        if let Some(mode) = crate::tls::pg_mode_with_files(url, tls).map_err(StoreError::Other)? {
            options = options.ssl_mode(mode.parse().expect("a mode sqlx knows"));
        }
        if let Some(ca) = &tls.ca_file {
            options = options.ssl_root_cert(ca);
        }
        if let Some((cert, key)) = tls.client() {
            options = options.ssl_client_cert(cert).ssl_client_key(key);
        }
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(map_err)?;
        let group = GroupCommit::start(pool.clone(), LANES);
        let group = Arc::new(group);
        // Two batches of claims (and of steps, of receipts, of leases and logs of delivery
        // events' tries) at a time across the lanes, the next gathering meanwhile.
        let claims = Arc::new(delivery::claims(group.clone(), 2));
        let steps = Arc::new(delivery::steps(group.clone(), 2));
        let receipts = Arc::new(receipts::receipts(group.clone(), 2));
        let leases = Arc::new(outbound::leases(group.clone(), 2));
        let logs = Arc::new(outbound::logs(group.clone(), 2));
        Ok(Self {
            pool,
            group,
            claims,
            steps,
            receipts,
            leases,
            logs,
        })
    }

    /// The underlying pool, for modules that keep their own tables in this database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes every connection; later calls fail with [`StoreError::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("../migrations/postgres")
            .run(&self.pool)
            .await
            .map_err(map_migrate_err)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    fn lane_totals(&self) -> super::LaneTotals {
        self.group.totals()
    }
}

impl Grouped for PgStore {
    type Db = Postgres;

    fn group(&self) -> &GroupCommit<Postgres> {
        &self.group
    }
}

impl Batches for PgStore {
    fn claims(&self) -> &Coalescer<ClaimRequest, Claim> {
        &self.claims
    }

    fn steps(&self) -> &Coalescer<StepRequest, ()> {
        &self.steps
    }
}

impl ReceiptBatches for PgStore {
    fn receipts(&self) -> &Coalescer<ReceiptWrite, ReceiptOutcome> {
        &self.receipts
    }
}

impl OutboundBatches for PgStore {
    fn leases(&self) -> &Coalescer<LeaseRequest, bool> {
        &self.leases
    }

    fn logs(&self) -> &Coalescer<LogRequest, Option<EndpointHealth>> {
        &self.logs
    }
}

/// A duration as an SQL interval, exact to the microsecond and capped at
/// [`MAX_INTERVAL_MICROS`].
pub(crate) fn interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(d.as_micros())
            .unwrap_or(i64::MAX)
            .min(MAX_INTERVAL_MICROS),
    }
}

/// JSON text for a `::jsonb` bind (sqlx's `json` feature is not enabled).
pub(crate) fn encode_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Other(format!("encoding JSON: {e}")))
}

/// Sorts a sqlx error into the store's three kinds. Messages come from sqlx or the
/// server's primary message, which carry no URL, password or row values.
pub(crate) fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(db) => {
            let message = db.message().to_string();
            if db.is_unique_violation() {
                return StoreError::Conflict(message);
            }
            match db.code().as_deref() {
                Some(code) if server_unavailable(code) => StoreError::Unavailable(message),
                _ => StoreError::Other(message),
            }
        }
        _ => StoreError::Other(e.to_string()),
    }
}

/// SQLSTATEs meaning "no usable session": connection exceptions (08), insufficient
/// resources such as too many connections (53), shutdown / not yet accepting (57P0x),
/// failed authentication (28) and a missing database (3D000); and those meaning "not
/// now", as SQLite's BUSY and LOCKED do: a lock not had within `lock_timeout` (55P03),
/// a deadlock (40P01), a serialization failure (40001) and a statement cancelled by a
/// timeout (57014). Either way the write is worth trying again, and a delivery whose
/// write failed so is retried, never given up on.
fn server_unavailable(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || code.starts_with("28")
        || matches!(code, "3D000" | "55P03" | "40P01" | "40001" | "57014")
}

fn map_migrate_err(e: sqlx::migrate::MigrateError) -> StoreError {
    match e {
        sqlx::migrate::MigrateError::Execute(e) => map_err(e),
        other => StoreError::Other(format!("migration failed: {other}")),
    }
}

#[cfg(test)]
mod tests;
