//! One job per item, a few threads at once: packs hashed and written, layers encrypted. Each
//! job reads, transforms and writes data of its own, so they scale with cores until the disk
//! is the limit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// Threads for `jobs` such jobs: one per core, up to 8.
fn workers(jobs: usize) -> usize {
    std::thread::available_parallelism()
        .map_or(2, usize::from)
        .clamp(1, 8)
        .min(jobs.max(1))
}

/// Runs `job(i, item)` for every item, each thread taking the next item not yet started. Once
/// a job fails no new one starts. Returns each item's result in order, `None` for an item
/// that was never started (only after a failure).
pub(crate) fn run_each<T, R, E, F>(items: &[T], job: F) -> Vec<Option<Result<R, E>>>
where
    T: Sync,
    R: Send,
    E: Send,
    F: Fn(usize, &T) -> Result<R, E> + Sync,
{
    let next = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<R, E>>>> =
        items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..workers(items.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= items.len() {
                    break;
                }
                let r = job(i, &items[i]);
                let failed = r.is_err();
                if let Ok(mut slot) = results[i].lock() {
                    *slot = Some(r);
                }
                if failed {
                    next.store(items.len(), Ordering::Relaxed);
                    break;
                }
            });
        }
    });
    results
        .into_iter()
        .map(|m| m.into_inner().ok().flatten())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_item_once_in_order_and_nothing_new_after_a_failure() {
        let items: Vec<u32> = (0..100).collect();
        let ok = run_each(&items, |i, v| Ok::<_, ()>(i as u32 * 1000 + v));
        let want: Vec<_> = (0..100u32).map(|v| Some(Ok(v * 1000 + v))).collect();
        assert_eq!(ok, want);

        let started = AtomicUsize::new(0);
        let failed = run_each(&items, |i, _| {
            started.fetch_add(1, Ordering::Relaxed);
            if i == 3 {
                Err(i)
            } else {
                Ok(i)
            }
        });
        assert_eq!(failed[3], Some(Err(3)));
        assert!(failed[..3].iter().all(Option::is_some));
        // Items taken before the failure was seen may finish; none is started much later.
        let ran = started.load(Ordering::Relaxed);
        assert!(ran < 3 + 2 * workers(100) + 1, "{ran} jobs ran");
        assert_eq!(failed.iter().filter(|r| r.is_some()).count(), ran);
    }
}
