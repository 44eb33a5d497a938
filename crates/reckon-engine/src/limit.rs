//! How many lookups each provider gets at once, found from its answers rather than set by
//! hand: additive increase while the provider answers as fast as it did, multiplicative
//! decrease when it slows down or refuses (TCP's congestion avoidance, with the latency
//! guard of Vegas-style limiters). A provider's `rate_per_sec` budget still holds on top:
//! the limit only decides how many requests wait on the provider at once.
//!
//! The limits live as long as the process (one [`Limits`] per reconciler), so each run of
//! the scheduler starts where the last one ended instead of learning again.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// What a finished lookup tells the limiter.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Signal {
    /// A complete answer (whatever it said), in this long.
    Answered(Duration),
    /// An answer from a provider with a request budget: its lookups wait on the budget's
    /// pace, so how long they took says nothing about the provider's speed.
    Paced,
    /// The provider is overloaded or unreachable: a timeout, a refused or reset connection,
    /// a 5xx, a 429.
    Overloaded,
    /// Nothing about the provider's capacity (a misconfigured adapter, no route).
    Neutral,
}

/// The bounds of every provider's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bounds {
    /// Where a provider starts, and what it never goes below after a slow start.
    pub initial: usize,
    /// The most lookups one provider may have in flight, however fast it answers.
    pub max: usize,
}

impl Bounds {
    pub fn new(initial: usize, max: usize) -> Bounds {
        let max = max.max(1);
        Bounds {
            initial: initial.clamp(1, max),
            max,
        }
    }
}

/// A decrease multiplies the limit by this.
const BACKOFF: f64 = 0.75;
/// An answer this many times slower than the fastest recent one is a queue at the
/// provider (or in front of it), not its own work.
const SLOW: f64 = 2.5;
/// The fastest answer is forgotten after this many answers, so a provider that became
/// slower for good is measured against its new speed.
const BASELINE_WINDOW: u32 = 500;

#[derive(Debug)]
struct Limit {
    limit: f64,
    in_flight: usize,
    /// Until the first sign of overload, the limit grows by one per answer (doubling per
    /// round trip); after it, by one per limit's worth of answers.
    slow_start: bool,
    /// The fastest answer of the current and of the last window.
    fastest: Option<Duration>,
    window_fastest: Option<Duration>,
    window_answers: u32,
    /// Lookups started so far; a permit holds its number.
    started: u64,
    /// Only a lookup started at or after this number can cut the limit again: the lookups
    /// already in flight when a provider slows down all come back slow, and they are one
    /// sign, not many (one decrease per round trip, as TCP's recovery point).
    recover_from: u64,
    /// Counts the times every place was taken or a lookup was refused for want of one: a
    /// lookup during which this moved ran at the limit.
    reached: u64,
}

impl Limit {
    fn new(b: Bounds) -> Limit {
        Limit {
            limit: b.initial as f64,
            in_flight: 0,
            slow_start: true,
            fastest: None,
            window_fastest: None,
            window_answers: 0,
            started: 0,
            recover_from: 0,
            reached: 0,
        }
    }

    fn current(&self) -> usize {
        self.limit as usize
    }

    fn observe(&mut self, b: Bounds, signal: Signal, saturated: bool, seq: u64) {
        let slow = match signal {
            Signal::Neutral => return,
            Signal::Overloaded => true,
            Signal::Paced => false,
            Signal::Answered(rtt) => {
                self.window_answers += 1;
                self.window_fastest = Some(self.window_fastest.map_or(rtt, |f| f.min(rtt)));
                let fastest = *self.fastest.get_or_insert(rtt);
                if rtt < fastest {
                    self.fastest = Some(rtt);
                }
                if self.window_answers >= BASELINE_WINDOW {
                    self.fastest = self.window_fastest.take();
                    self.window_answers = 0;
                }
                rtt.as_secs_f64() > fastest.as_secs_f64() * SLOW
            }
        };
        if slow {
            if seq >= self.recover_from {
                self.limit = (self.limit * BACKOFF).max(1.0);
                self.slow_start = false;
                self.recover_from = self.started;
            }
        } else if saturated {
            // Only a limit that was reached says anything about whether a larger one helps.
            self.limit += if self.slow_start {
                1.0
            } else {
                1.0 / self.limit
            };
        }
        self.limit = self.limit.min(b.max as f64);
    }
}

/// The limits of all providers of one reconciler, by provider id.
#[derive(Debug, Default)]
pub struct Limits {
    by_provider: Mutex<HashMap<i64, Limit>>,
}

impl Limits {
    fn with<T>(&self, provider: i64, b: Bounds, f: impl FnOnce(&mut Limit) -> T) -> T {
        let mut map = self
            .by_provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let l = map.entry(provider).or_insert_with(|| Limit::new(b));
        // Bounds lowered since (a new setting) take effect at once.
        l.limit = l.limit.min(b.max as f64);
        f(l)
    }

    /// Start a lookup of `provider` if its limit has room; the permit ends it.
    pub fn try_start(&self, provider: i64, bounds: Bounds) -> Option<Permit<'_>> {
        self.with(provider, bounds, |l| {
            let mark = l.reached;
            if l.in_flight >= l.current().max(1) {
                l.reached += 1;
                return None;
            }
            l.in_flight += 1;
            if l.in_flight >= l.current() {
                l.reached += 1;
            }
            let seq = l.started;
            l.started += 1;
            Some(Permit {
                limits: self,
                bounds,
                provider,
                mark,
                seq,
                done: false,
            })
        })
    }

    /// The provider's limit now.
    pub fn limit(&self, provider: i64, bounds: Bounds) -> usize {
        self.with(provider, bounds, |l| l.current())
    }

    /// Lookups of the provider in flight now.
    pub fn in_flight(&self, provider: i64, bounds: Bounds) -> usize {
        self.with(provider, bounds, |l| l.in_flight)
    }

    /// The sum of the limits of `providers` (those not seen yet at the initial limit): how
    /// many lookups a run over them can have in flight at once.
    pub fn total(&self, providers: impl IntoIterator<Item = i64>, bounds: Bounds) -> usize {
        let map = self
            .by_provider
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        providers
            .into_iter()
            .map(|p| {
                map.get(&p)
                    .map_or(bounds.initial, |l| l.current().clamp(1, bounds.max))
            })
            .sum()
    }
}

/// One lookup in flight. Ending it with [`Permit::finish`] tells the limiter how it went;
/// dropping it unfinished (a cancelled lookup) frees its place and tells nothing.
pub struct Permit<'a> {
    limits: &'a Limits,
    bounds: Bounds,
    provider: i64,
    /// `Limit::reached` before the lookup started.
    mark: u64,
    /// The lookup's number (`Limit::started`).
    seq: u64,
    done: bool,
}

impl Permit<'_> {
    pub fn finish(mut self, signal: Signal) {
        self.done = true;
        let (bounds, mark, seq) = (self.bounds, self.mark, self.seq);
        self.limits.with(self.provider, bounds, |l| {
            l.in_flight = l.in_flight.saturating_sub(1);
            let saturated = l.reached > mark;
            l.observe(bounds, signal, saturated, seq);
        });
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if !self.done {
            self.limits.with(self.provider, self.bounds, |l| {
                l.in_flight = l.in_flight.saturating_sub(1);
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: fn(u64) -> Duration = Duration::from_millis;

    /// A limiter of one provider (id 1) within `bounds`.
    struct One {
        limits: Limits,
        bounds: Bounds,
    }

    impl One {
        fn new(initial: usize, max: usize) -> One {
            One {
                limits: Limits::default(),
                bounds: Bounds::new(initial, max),
            }
        }
        fn try_start(&self, provider: i64) -> Option<Permit<'_>> {
            self.limits.try_start(provider, self.bounds)
        }
        fn limit(&self, provider: i64) -> usize {
            self.limits.limit(provider, self.bounds)
        }
        fn in_flight(&self, provider: i64) -> usize {
            self.limits.in_flight(provider, self.bounds)
        }
    }

    /// Run `n` lookups at the limit, each answered with `signal`.
    fn rounds(l: &One, n: usize, signal: Signal) {
        for _ in 0..n {
            let permits: Vec<_> = std::iter::from_fn(|| l.try_start(1)).collect();
            assert!(
                !permits.is_empty(),
                "a provider always gets at least one lookup"
            );
            for p in permits {
                p.finish(signal);
            }
        }
    }

    #[test]
    fn a_provider_that_answers_in_constant_time_is_given_the_maximum() {
        let l = One::new(8, 64);
        assert_eq!(l.limit(1), 8);
        rounds(&l, 3, Signal::Answered(MS(50)));
        assert_eq!(
            l.limit(1),
            64,
            "slow start doubles per round trip, up to the bound"
        );
        rounds(&l, 10, Signal::Answered(MS(50)));
        assert_eq!(l.limit(1), 64);
    }

    #[test]
    fn overload_cuts_the_limit_once_per_round_trip_and_growth_resumes_slowly() {
        let l = One::new(32, 64);
        rounds(&l, 1, Signal::Answered(MS(50)));
        assert_eq!(l.limit(1), 64);
        // All 64 lookups in flight come back refused: one decrease, not 64.
        rounds(&l, 1, Signal::Overloaded);
        assert_eq!(l.limit(1), 48);
        rounds(&l, 1, Signal::Overloaded);
        assert_eq!(l.limit(1), 36);
        // Out of slow start: about one more per round trip.
        rounds(&l, 4, Signal::Answered(MS(50)));
        assert!((39..=40).contains(&l.limit(1)), "{}", l.limit(1));
    }

    #[test]
    fn answers_slowing_down_shrink_the_limit_down_to_one_and_never_to_zero() {
        let l = One::new(16, 64);
        rounds(&l, 1, Signal::Answered(MS(20)));
        rounds(&l, 30, Signal::Answered(MS(200)));
        assert_eq!(l.limit(1), 1);
        assert!(l.try_start(1).is_some());
    }

    #[test]
    fn a_provider_slower_for_good_is_measured_against_its_new_speed() {
        let l = One::new(4, 8);
        rounds(&l, 1, Signal::Answered(MS(10)));
        let mut answers = 0;
        while answers < 2 * BASELINE_WINDOW as usize {
            let permits: Vec<_> = std::iter::from_fn(|| l.try_start(1)).collect();
            answers += permits.len();
            for p in permits {
                p.finish(Signal::Answered(MS(100)));
            }
        }
        let after_shift = l.limit(1);
        rounds(&l, 200, Signal::Answered(MS(100)));
        assert!(
            l.limit(1) >= after_shift && l.limit(1) == 8,
            "grows again at the new speed: {} then {}",
            after_shift,
            l.limit(1)
        );
    }

    #[test]
    fn providers_are_limited_apart_and_a_dropped_permit_frees_its_place() {
        let l = One::new(2, 8);
        let a: Vec<_> = std::iter::from_fn(|| l.try_start(1)).collect();
        assert_eq!(a.len(), 2);
        assert!(l.try_start(2).is_some(), "another provider is not held up");
        drop(a);
        assert_eq!(l.in_flight(1), 0);
        assert_eq!(l.limit(1), 2, "a cancelled lookup tells nothing");
        rounds(&l, 1, Signal::Neutral);
        assert_eq!(l.limit(1), 2);
    }

    #[test]
    fn a_run_may_have_the_sum_of_its_providers_limits_in_flight() {
        let l = One::new(4, 16);
        rounds(&l, 1, Signal::Answered(MS(50)));
        assert_eq!(
            l.limits.total([1, 2], l.bounds),
            8 + 4,
            "provider 2 not seen yet"
        );
        let lower = Bounds::new(4, 6);
        assert_eq!(l.limits.limit(1, lower), 6, "a lowered bound holds at once");
    }

    #[test]
    fn waiting_on_a_budget_is_not_a_slow_provider() {
        let l = One::new(8, 32);
        rounds(&l, 1, Signal::Answered(MS(50)));
        rounds(&l, 3, Signal::Paced);
        assert_eq!(l.limit(1), 32);
        rounds(&l, 1, Signal::Overloaded);
        assert_eq!(l.limit(1), 24, "a refusal still counts");
    }

    #[test]
    fn bounds_are_at_least_one() {
        assert_eq!(Bounds::new(0, 0), Bounds { initial: 1, max: 1 });
        assert_eq!(
            Bounds::new(100, 10),
            Bounds {
                initial: 10,
                max: 10
            }
        );
    }
}
