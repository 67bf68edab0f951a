//! `GET /v1/events/{eventId}` and `GET /v1/messages`: the recorded messages of the
//! caller's workspace.
//!
//! The handlers only authenticate, call the plain functions below and the store, and
//! shape the answer. Parsing (event ids, list queries) and the opaque cursor are plain
//! functions with unit tests.

use super::ApiError;
use super::error::ErrorBody;
use super::extract::Caller;
use crate::AppState;
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    MessageCursor, MessageFilter, MessageRecord, MessageStatus, StepStatus, TimelineEntry,
};
use crate::routing::Channel;
use crate::store::Queries;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::routing::get;
use axum::{Json, Router};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Default page size of `GET /v1/messages`.
pub const DEFAULT_LIMIT: u32 = 50;
/// Largest page size of `GET /v1/messages`.
pub const MAX_LIMIT: u32 = 100;

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/v1/events/{eventId}", get(get_event))
        .route("/v1/messages", get(list_messages))
}

// ---------------------------------------------------------------------------------------
// Wire shapes
// ---------------------------------------------------------------------------------------

/// The spec's MessageDto. Optional fields are omitted when they have no value (never
/// sent as `null`), as in TriggerResponse. Datetimes are RFC 3339 UTC with microseconds
/// (the stored precision), so a `created_at` can be passed back as `from` or `to`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct MessageDto {
    /// Public id, `evt_<hex>`.
    pub event_id: String,
    /// Workflow name originally triggered.
    pub event_name: String,
    /// Target subscriber (empty once scrubbed by an erasure past the audit window).
    pub subscriber_id: String,
    /// 0 = Critical, 1 = High, 2 = Normal, 3 = Low.
    #[schema(minimum = 0, maximum = 3)]
    pub priority: i32,
    /// Current delivery status.
    pub status: MessageStatus,
    /// Delivery attempts made.
    pub attempts: i32,
    /// Cost in micro-USD (1 = $0.000001).
    pub cost_micro_usd: i64,
    /// True when triggered with a test API key.
    pub test_mode: bool,
    /// Keys of the supplied payload variables; raw values are not stored.
    pub variables_keys: Vec<String>,
    /// Ingestion time (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub created_at: String,
    /// Last update time (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub updated_at: String,
    /// Event category.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Channel dispatched or selected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Provider that handled or attempted delivery.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// The provider's message id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_message_id: Option<String>,
    /// Error code when delivery failed or was withheld (`DISPATCH_FAILED`, `SUPPRESSED`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// Human-readable failure detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_detail: Option<String>,
    /// Chronological timeline: always present on `GET /v1/events/{eventId}`, omitted
    /// from list items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub events: Option<Vec<EventItemDto>>,
}

/// The spec's EventItemDto: one timeline step.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct EventItemDto {
    /// Position in this message's timeline: 1, 2, 3, ... (per message, so it reveals
    /// nothing of other messages).
    pub seq: i64,
    /// `queued`, `sent`, `delivered` or `failed`.
    pub status: StepStatus,
    /// When it happened (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub occurred_at: String,
    /// Provider involved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Additional provider or failure details (for voice: call duration in seconds and
    /// `cost_micro_usd`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<serde_json::Value>,
}

/// The spec's ListMessagesResponse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
pub struct ListMessagesResponse {
    /// One page, newest first (`created_at`, then `event_id`, both descending).
    pub messages: Vec<MessageDto>,
    /// Cursor of the next page; omitted at the end of the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_cursor: Option<String>,
}

/// RFC 3339, UTC (`Z`), microseconds.
pub fn format_time(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

impl EventItemDto {
    /// The `position`-th entry (1-based) of its message's timeline. The stored sequence
    /// is global, so it would show how much every other tenant sent in between; the
    /// answer numbers each message's timeline on its own, in the stored order.
    fn at(position: usize, e: TimelineEntry) -> Self {
        EventItemDto {
            seq: position as i64,
            status: e.status,
            occurred_at: format_time(&e.occurred_at),
            provider: e.provider,
            detail: e.detail,
        }
    }
}

impl From<MessageRecord> for MessageDto {
    fn from(m: MessageRecord) -> Self {
        MessageDto {
            event_id: m.event_id.to_string(),
            event_name: m.event_name,
            subscriber_id: m.subscriber_id,
            priority: m.priority,
            status: m.status,
            attempts: m.attempts,
            cost_micro_usd: m.cost_micro_usd,
            test_mode: m.test_mode,
            variables_keys: m.variables_keys,
            created_at: format_time(&m.created_at),
            updated_at: format_time(&m.updated_at),
            category: m.category,
            channel: m.channel,
            provider: m.provider,
            provider_message_id: m.provider_message_id,
            error_code: m.error_code,
            error_detail: m.error_detail,
            events: m.timeline.map(|t| {
                t.into_iter()
                    .enumerate()
                    .map(|(i, e)| EventItemDto::at(i + 1, e))
                    .collect()
            }),
        }
    }
}

// ---------------------------------------------------------------------------------------
// Event ids
// ---------------------------------------------------------------------------------------

/// Parses the path's event id: `evt_<lower-case hex>`, or a UUID in any form the `uuid`
/// crate reads (hyphenated, simple, braced, `urn:uuid:`; either case), which names
/// `evt_` + its 32 lower-case simple hex digits (the form the gateway generates).
pub fn parse_event_id(s: &str) -> Result<EventId, String> {
    if s.starts_with(EventId::PREFIX) {
        return EventId::parse(s).map_err(|_| {
            "invalid event id: expected evt_ followed by lower-case hex digits, or a UUID"
                .to_string()
        });
    }
    match uuid::Uuid::try_parse(s) {
        Ok(u) => {
            EventId::parse(&format!("{}{}", EventId::PREFIX, u.simple())).map_err(|e| e.to_string())
        }
        Err(_) => Err("invalid event id: expected evt_<hex> or a UUID".into()),
    }
}

// ---------------------------------------------------------------------------------------
// List query
// ---------------------------------------------------------------------------------------

/// A parsed `GET /v1/messages` query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListQuery {
    /// The filters.
    pub filter: MessageFilter,
    /// Page size, 0 to 100.
    pub limit: u32,
    /// The raw `cursor`, checked against the filters by [`decode_cursor`].
    pub cursor: Option<String>,
}

/// Parameters read from the list query; any other parameter is ignored.
const LIST_PARAMS: [&str; 8] = [
    "status",
    "channel",
    "subscriber_id",
    "subscriber",
    "from",
    "to",
    "limit",
    "cursor",
];

/// The filters and paging of a message list as given, before validation: the query
/// parameters of `GET /v1/messages`, or the arguments of the MCP tool `list_messages`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {
    /// Exact status, upper or lower case (`SENT`, `bounced_hard`, ...).
    pub status: Option<String>,
    /// `sms`, `email`, `whatsapp`, `push` or `voice` (lower or upper case).
    pub channel: Option<String>,
    /// Exact subscriber id.
    pub subscriber_id: Option<String>,
    /// RFC 3339: created at or after.
    pub from: Option<String>,
    /// RFC 3339: created at or before; not before `from`.
    pub to: Option<String>,
    /// Page size, 0 to 100 (default 50); 0 returns an empty page.
    #[schemars(range(max = 100))]
    pub limit: Option<u32>,
    /// `next_cursor` of the previous page, with the same filters.
    pub cursor: Option<String>,
}

/// Parses the raw query string of `GET /v1/messages` (or the 400 message).
///
/// Rules: unknown parameters are ignored; an empty value is an error; a known
/// parameter given twice is an error (except `subscriber`/`subscriber_id` with one
/// value); `limit` a decimal integer; then [`ListParams::validate`].
pub fn parse_list_query(raw: Option<&str>) -> Result<ListQuery, String> {
    let mut values: [Option<String>; LIST_PARAMS.len()] = Default::default();
    for (name, value) in url::form_urlencoded::parse(raw.unwrap_or("").as_bytes()) {
        let Some(i) = LIST_PARAMS.iter().position(|p| *p == name) else {
            continue;
        };
        // `to=` is a mistake, not a request for everything: the document says each
        // parameter has a value, and the server holds to it.
        if value.is_empty() {
            return Err(format!(
                "query parameter `{name}` is empty: give it a value or leave it out"
            ));
        }
        if values[i].is_some() {
            return Err(format!("query parameter `{name}` given more than once"));
        }
        values[i] = Some(value.into_owned());
    }
    let [
        status,
        channel,
        subscriber_id,
        subscriber,
        from,
        to,
        limit,
        cursor,
    ] = values;
    let subscriber_id = match (subscriber_id, subscriber) {
        (Some(a), Some(b)) if a != b => {
            return Err("`subscriber_id` and its alias `subscriber` differ".into());
        }
        (a, b) => a.or(b),
    };
    let limit = match limit {
        None => None,
        Some(l) => match l.parse::<u32>() {
            Ok(n) if l.bytes().all(|b| b.is_ascii_digit()) => Some(n),
            _ => return Err(format!("limit must be an integer from 0 to {MAX_LIMIT}")),
        },
    };
    ListParams {
        status,
        channel,
        subscriber_id,
        from,
        to,
        limit,
        cursor,
    }
    .validate()
}

impl ListParams {
    /// Checks the values (or says why not): `status` is one of the eleven statuses in
    /// upper or lower case; `channel` one of `sms`, `email`, `whatsapp`, `push`,
    /// `voice` (lower or upper case); `subscriber_id` within the ingestion limits;
    /// `from`/`to` RFC 3339 with `from` <= `to`; `limit` at most 100 (default 50).
    pub fn validate(self) -> Result<ListQuery, String> {
        let status = self
            .status
            .map(|s| {
                parse_status(&s).ok_or_else(|| {
                    format!(
                        "invalid status `{s}`: expected one of {}",
                        MessageStatus::ALL.map(|s| s.as_str()).join(", ")
                    )
                })
            })
            .transpose()?;
        let channel = self
            .channel
            .map(|c| {
                parse_channel(&c)
                    .map(|c| c.as_str().to_string())
                    .ok_or_else(|| {
                        format!(
                            "invalid channel `{c}`: expected sms, email, whatsapp, push or voice"
                        )
                    })
            })
            .transpose()?;
        if let Some(s) = &self.subscriber_id {
            validate_subscriber_id(s).map_err(|e| format!("subscriber_id {e}"))?;
        }
        let from = self.from.map(|v| parse_time("from", &v)).transpose()?;
        let to = self.to.map(|v| parse_time("to", &v)).transpose()?;
        if let (Some(f), Some(t)) = (from, to)
            && f > t
        {
            return Err("`from` is later than `to`".into());
        }
        let limit = match self.limit {
            None => DEFAULT_LIMIT,
            Some(n) if n <= MAX_LIMIT => n,
            Some(_) => return Err(format!("limit must be an integer from 0 to {MAX_LIMIT}")),
        };
        Ok(ListQuery {
            filter: MessageFilter {
                status,
                channel,
                subscriber_id: self.subscriber_id,
                from,
                to,
            },
            limit,
            cursor: self.cursor,
        })
    }
}

/// `SENT` or `sent` (all upper or all lower case).
fn parse_status(s: &str) -> Option<MessageStatus> {
    MessageStatus::parse(s).or_else(|| {
        if s.bytes().all(|b| !b.is_ascii_uppercase()) {
            MessageStatus::parse(&s.to_ascii_uppercase())
        } else {
            None
        }
    })
}

/// `sms` or `SMS` (all lower or all upper case).
fn parse_channel(s: &str) -> Option<Channel> {
    let lower = s.to_ascii_lowercase();
    if s != lower && s != s.to_ascii_uppercase() {
        return None;
    }
    [
        Channel::Sms,
        Channel::Email,
        Channel::Whatsapp,
        Channel::Push,
        Channel::Voice,
    ]
    .into_iter()
    .find(|c| c.as_str() == lower)
}

/// RFC 3339. A `+` of the offset that arrived as a space (an unescaped `+` in a query
/// string decodes to a space) is read as `+`.
fn parse_time(name: &str, v: &str) -> Result<DateTime<Utc>, String> {
    let parsed = DateTime::parse_from_rfc3339(v).or_else(|e| {
        let n = v.len();
        if n > 6 && v.as_bytes()[n - 6] == b' ' {
            DateTime::parse_from_rfc3339(&format!("{}+{}", &v[..n - 6], &v[n - 5..]))
        } else {
            Err(e)
        }
    });
    parsed
        .map(|t| t.with_timezone(&Utc))
        .map_err(|_| format!("`{name}` must be an RFC 3339 date-time, e.g. 2025-01-31T12:00:00Z"))
}

/// The ingestion limits on a subscriber id: 1-256 characters, not only whitespace, no
/// control characters. The error completes "subscriberId ...".
pub use crate::ingest::validate_subscriber_id;

// ---------------------------------------------------------------------------------------
// Cursor
// ---------------------------------------------------------------------------------------

/// Domain string of the cursor's check value.
const CURSOR_DOMAIN: &[u8] = b"switchboard/v1/messages/cursor";
/// Cursor layout version.
const CURSOR_VERSION: u8 = 1;
/// version (1) + created_at micros (8) + filter digest (8).
const CURSOR_HEAD: usize = 17;
/// Check value length.
const CURSOR_CHECK: usize = 8;

/// Why a cursor was refused (all are 400s).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CursorError {
    /// Not base64url, too short, wrong version or a bad check value.
    #[error("invalid cursor: pass back a `next_cursor` unchanged")]
    Malformed,
    /// Well-formed, but issued for other filters (or another workspace).
    #[error("cursor was issued for different filters: keep the filters of the first page")]
    OtherFilters,
}

/// First 8 bytes of SHA-256 over the workspace and the filters: ties a cursor to the
/// query it was issued for (the page size may change between pages).
pub fn filter_digest(workspace: &WorkspaceId, filter: &MessageFilter) -> [u8; 8] {
    let canonical = serde_json::json!([
        workspace.as_str(),
        filter.status.map(|s| s.as_str()),
        filter.channel,
        filter.subscriber_id,
        filter
            .from
            .map(|t| t.to_rfc3339_opts(SecondsFormat::Nanos, true)),
        filter
            .to
            .map(|t| t.to_rfc3339_opts(SecondsFormat::Nanos, true)),
    ]);
    let mut hasher = Sha256::new();
    hasher.update(b"switchboard/v1/messages/filters\0");
    hasher.update(canonical.to_string().as_bytes());
    first8(&hasher.finalize())
}

fn first8(digest: &[u8]) -> [u8; 8] {
    let mut out = [0; 8];
    out.copy_from_slice(&digest[..8]);
    out
}

fn cursor_check(body: &[u8]) -> [u8; 8] {
    let mut hasher = Sha256::new();
    hasher.update(CURSOR_DOMAIN);
    hasher.update(body);
    first8(&hasher.finalize())
}

/// The opaque cursor: base64url (no padding) of `version (1) | created_at as
/// microseconds since the epoch (i64, big-endian) | filter digest (8) | event id
/// (ASCII) | check (8)`, the check being the first 8 bytes of SHA-256 over a fixed
/// domain string and everything before it.
pub fn encode_cursor(position: &MessageCursor, digest: [u8; 8]) -> String {
    let id = position.event_id.as_str().as_bytes();
    let mut bytes = Vec::with_capacity(CURSOR_HEAD + id.len() + CURSOR_CHECK);
    bytes.push(CURSOR_VERSION);
    bytes.extend_from_slice(&position.created_at.timestamp_micros().to_be_bytes());
    bytes.extend_from_slice(&digest);
    bytes.extend_from_slice(id);
    let check = cursor_check(&bytes);
    bytes.extend_from_slice(&check);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// Reads a cursor made by [`encode_cursor`] for the filters whose digest is `digest`.
pub fn decode_cursor(s: &str, digest: [u8; 8]) -> Result<MessageCursor, CursorError> {
    // An event id is at most 68 characters: no honest cursor is longer than this.
    if s.len() > 160 {
        return Err(CursorError::Malformed);
    }
    let bytes = URL_SAFE_NO_PAD
        .decode(s)
        .map_err(|_| CursorError::Malformed)?;
    if bytes.len() <= CURSOR_HEAD + CURSOR_CHECK || bytes[0] != CURSOR_VERSION {
        return Err(CursorError::Malformed);
    }
    let (body, check) = bytes.split_at(bytes.len() - CURSOR_CHECK);
    if cursor_check(body) != check {
        return Err(CursorError::Malformed);
    }
    if body[9..CURSOR_HEAD] != digest {
        return Err(CursorError::OtherFilters);
    }
    let micros = i64::from_be_bytes(body[1..9].try_into().map_err(|_| CursorError::Malformed)?);
    let created_at = DateTime::from_timestamp_micros(micros).ok_or(CursorError::Malformed)?;
    let event_id = std::str::from_utf8(&body[CURSOR_HEAD..])
        .ok()
        .and_then(|id| EventId::parse(id).ok())
        .ok_or(CursorError::Malformed)?;
    Ok(MessageCursor {
        created_at,
        event_id,
    })
}

/// Turns up to `limit + 1` fetched rows into a page: the first `limit`, and a cursor
/// after the last of them when a further row exists.
pub fn page(mut rows: Vec<MessageRecord>, limit: u32, digest: [u8; 8]) -> ListMessagesResponse {
    let limit = limit as usize;
    let next_cursor = if rows.len() > limit && limit > 0 {
        rows.truncate(limit);
        rows.last().map(|last| {
            encode_cursor(
                &MessageCursor {
                    created_at: last.created_at,
                    event_id: last.event_id.clone(),
                },
                digest,
            )
        })
    } else {
        rows.truncate(limit);
        None
    };
    ListMessagesResponse {
        messages: rows.into_iter().map(MessageDto::from).collect(),
        next_cursor,
    }
}

// ---------------------------------------------------------------------------------------
// Handlers
// ---------------------------------------------------------------------------------------

/// One message of the caller's workspace, with its timeline.
#[utoipa::path(get, operation_id = "getEvent", path = "/v1/events/{eventId}", tag = "messages",
    params(("eventId" = String, Path, description = "`evt_<hex>`, or a UUID (read as `evt_` + its 32 simple hex digits)")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "The message and its timeline", body = MessageDto),
        (status = 400, description = "Invalid event id format", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 404, description = "No such event in this workspace", body = ErrorBody),
        (status = 500, description = "Database error", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody),
    ))]
pub async fn get_event(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<MessageDto>, ApiError> {
    let Path(raw) = path.map_err(|e| ApiError::BadRequest(format!("invalid event id: {e}")))?;
    message_with_timeline(&*state.ingest.store, &caller.key.workspace, &raw)
        .await
        .map(Json)
}

/// One message of `workspace` with its timeline (always present, maybe empty), by
/// the event id as given: 400 for a malformed id, 404 when the workspace has no such
/// event.
pub async fn message_with_timeline(
    store: &dyn Queries,
    workspace: &WorkspaceId,
    raw_id: &str,
) -> Result<MessageDto, ApiError> {
    let id = parse_event_id(raw_id).map_err(ApiError::BadRequest)?;
    let message = store
        .get_message(workspace, &id)
        .await
        .map_err(ApiError::from_store_read)?
        .ok_or_else(|| ApiError::ResourceNotFound(format!("no event {id} in this workspace")))?;
    let mut dto = MessageDto::from(message);
    dto.events.get_or_insert_with(Vec::new);
    Ok(dto)
}

/// Messages of the caller's workspace, newest first, with cursor pagination.
#[utoipa::path(get, operation_id = "listMessages", path = "/v1/messages", tag = "messages",
    params(
        ("status" = Option<String>, Query, description = "Exact status, upper or lower case (`SENT`, `bounced_hard`, ...)"),
        ("channel" = Option<String>, Query, description = "`sms`, `email`, `whatsapp`, `push` or `voice`"),
        ("subscriber_id" = Option<String>, Query, description = "Exact subscriber id"),
        ("subscriber" = Option<String>, Query, description = "Alias of `subscriber_id`; if both are given they must be equal"),
        ("from" = Option<String>, Query, format = DateTime, description = "RFC 3339: created at or after"),
        ("to" = Option<String>, Query, format = DateTime, description = "RFC 3339: created at or before; not before `from`"),
        ("limit" = Option<u32>, Query, minimum = 0, maximum = 100, description = "Page size, default 50; 0 returns an empty page"),
        ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page, with the same filters"),
    ),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "One page, newest first", body = ListMessagesResponse),
        (status = 400, description = "Invalid query parameter or cursor", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 500, description = "Database error", body = ErrorBody),
        (status = 503, description = "Database unavailable", body = ErrorBody),
    ))]
pub async fn list_messages(
    State(state): State<AppState>,
    caller: Caller,
    RawQuery(raw): RawQuery,
) -> Result<Json<ListMessagesResponse>, ApiError> {
    let query = parse_list_query(raw.as_deref()).map_err(ApiError::BadRequest)?;
    list_page(&*state.ingest.store, &caller.key.workspace, &query)
        .await
        .map(Json)
}

/// One page of `workspace`'s messages for a validated query: 400 for a cursor that
/// is malformed or was issued for other filters.
pub async fn list_page(
    store: &dyn Queries,
    workspace: &WorkspaceId,
    query: &ListQuery,
) -> Result<ListMessagesResponse, ApiError> {
    let digest = filter_digest(workspace, &query.filter);
    let after = query
        .cursor
        .as_deref()
        .map(|c| decode_cursor(c, digest))
        .transpose()
        .map_err(|e| ApiError::BadRequest(e.to_string()))?;
    if query.limit == 0 {
        return Ok(page(Vec::new(), 0, digest));
    }
    let rows = store
        .list_messages(workspace, &query.filter, after.as_ref(), query.limit + 1)
        .await
        .map_err(ApiError::from_store_read)?;
    Ok(page(rows, query.limit, digest))
}

#[cfg(test)]
mod tests;
