//! What each item of a bulk request says when it is not queued.

use super::{BulkEventResult, IngestError};

/// What a bulk item that could not be queued says: its reason, except that an internal
/// cause (a database's or broker's own words, which may name users, tables or hosts) is
/// logged and the item says only that it failed, as a 500 does.
pub(super) fn item_error(index: usize, error: IngestError) -> BulkEventResult {
    match error {
        IngestError::Internal(cause) => {
            tracing::error!(index, error = %cause, "a bulk event could not be queued");
            failed(index, INTERNAL_ITEM_ERROR.into())
        }
        other => failed(index, other.to_string()),
    }
}

/// The error of a bulk item that failed inside the gateway (the cause is logged).
const INTERNAL_ITEM_ERROR: &str =
    "internal error: the event could not be queued (the cause is in the gateway's log)";

pub(super) fn failed(index: usize, error: String) -> BulkEventResult {
    BulkEventResult {
        index,
        status: "FAILED".into(),
        event_id: None,
        channel: None,
        error: Some(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bulk_item_names_its_reason_but_not_an_internal_cause() {
        let cause = "could not record the event: database error: permission denied for table messages (user switchboard_rw)";
        let item = item_error(3, IngestError::Internal(cause.into()));
        assert_eq!((item.index, item.status.as_str()), (3, "FAILED"));
        assert_eq!(item.error.as_deref(), Some(INTERNAL_ITEM_ERROR));
        let item = item_error(4, IngestError::TooLarge("event too large".into()));
        assert_eq!(item.error.as_deref(), Some("event too large"));
    }
}
