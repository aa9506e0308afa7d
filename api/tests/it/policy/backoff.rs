//! How long a restarted unit waits: the base doubled per attempt, at most an hour.

use std::time::Duration;

use tandem_api::policy::{self, backoff};

#[test]
fn backoff_doubles_and_is_capped_at_an_hour() {
    assert_eq!(backoff(10, 1), Duration::from_secs(10));
    assert_eq!(backoff(10, 2), Duration::from_secs(20));
    assert_eq!(backoff(10, 4), Duration::from_secs(80));
    assert_eq!(backoff(10, 30), Duration::from_secs(3600));
    assert_eq!(backoff(u32::MAX, 1), policy::MAX_BACKOFF);
    assert_eq!(backoff(0, 5), Duration::ZERO);
    assert_eq!(backoff(10, 0), Duration::from_secs(10), "attempt 0 waits the base");
}
