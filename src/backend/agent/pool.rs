//! The session permits of an agent backend: `max_sessions` of them, one held by each live or
//! suspended turn (and, for a kind whose idle sessions are processes, by each idle one).
//! A turn that finds none free waits up to `acquire_timeout`, then fails with
//! `BackendError::Capacity`; after shutdown, none is handed out.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::backend::BackendError;

pub struct Permits {
    sem: Arc<Semaphore>,
    capacity: usize,
    acquire_timeout: Duration,
}

impl Permits {
    pub fn new(capacity: usize, acquire_timeout: Duration) -> Permits {
        Permits {
            sem: Arc::new(Semaphore::new(capacity)),
            capacity,
            acquire_timeout,
        }
    }

    /// One session's permit; given back when dropped.
    pub async fn acquire(&self) -> Result<OwnedSemaphorePermit, BackendError> {
        tokio::time::timeout(self.acquire_timeout, self.sem.clone().acquire_owned())
            .await
            .map_err(|_| BackendError::Capacity)?
            .map_err(|_| BackendError::Unavailable("shutting down".into()))
    }

    /// A permit if one is free now.
    pub fn try_acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().try_acquire_owned().ok()
    }

    /// Permits held now.
    pub fn busy(&self) -> usize {
        self.capacity - self.sem.available_permits()
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// No permit is handed out any more; waiting turns fail.
    pub fn close(&self) {
        self.sem.close();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_turn_waits_for_a_permit_then_fails_with_capacity() {
        let permits = Permits::new(1, Duration::from_secs(3));
        let held = permits.acquire().await.unwrap();
        assert_eq!(permits.busy(), 1);
        assert_eq!(permits.acquire().await.unwrap_err(), BackendError::Capacity);
        drop(held);
        let again = permits.acquire().await.unwrap();
        drop(again);
        permits.close();
        assert!(matches!(
            permits.acquire().await,
            Err(BackendError::Unavailable(_))
        ));
        assert_eq!(permits.capacity(), 1);
    }
}
