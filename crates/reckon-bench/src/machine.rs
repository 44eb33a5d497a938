//! What a bench says of the machine it ran on, and the load it can add to it: the user's
//! database shares its machine, so a figure counts only beside the load it was taken at.

/// The 1, 5 and 15 minute load averages, as the kernel reports them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

/// One core kept busy for the rest of the process: a thread that never sleeps, counting so
/// the optimiser cannot drop the loop.
pub fn busy_core() {
    std::thread::spawn(|| {
        let mut n = 0u64;
        loop {
            n = std::hint::black_box(n.wrapping_add(1));
        }
    });
}
