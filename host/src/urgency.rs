//! Urgent work: a task-local mark that critical deliveries and their ingestion carry, so
//! that the shared resources they meet (the store's group-commit lanes, the plugin
//! runtime's instance slots) serve them ahead of, or beside, bulk work.

tokio::task_local! {
    /// Set (by [`urgent`]) around work that must not wait behind bulk work.
    static URGENT: bool;
}

/// Runs `work` as urgent: its group-commit writes go ahead of every write waiting that
/// is not urgent, and its plugin calls may use the instance slots kept from bulk work.
pub async fn urgent<F: std::future::Future>(work: F) -> F::Output {
    URGENT.scope(true, work).await
}

/// Whether the current task runs inside [`urgent`].
pub fn is_urgent() -> bool {
    URGENT.try_with(|u| *u).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn only_work_inside_urgent_is_urgent() {
        assert!(!is_urgent());
        assert!(urgent(async { is_urgent() }).await);
        assert!(!is_urgent());
    }
}
