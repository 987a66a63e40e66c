//! What the record path allocates per record. Counted with a global allocator over a whole
//! in-process mirror run (both mock clusters in this process, the production pipeline between
//! them), for two backlog sizes; the difference divided by the extra records is the
//! allocations per record.
//!
//! Nothing on the record path allocates per record: records are polled from the consumer's
//! queue by our own loop (`source`, which owns each fetch event instead of wrapping it in an
//! `Arc` as rust-rdkafka's `BaseConsumer::poll` does) and go to librdkafka through
//! `rd_kafka_producev` with cached topic names; headers are copied by librdkafka.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mirror_maker::mirror::state::{Control, Stats};
use mirror_maker::settings::client::{ClientProps, Role};
use mirror_maker::settings::routing::TopicFilter;
use mirror_maker::settings::{Settings, SettingsOptions};
use mirror_maker::tools::demo::write_samples;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

#[allow(unsafe_code)] // a counting allocator is unsafe by its trait
                      // SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed on as is.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 8;

/// Heap allocations made while mirroring `records` sample records (with headers), from the
/// start of the pipeline to the end of its shutdown.
fn allocations_to_mirror(records: u64, provenance: bool) -> u64 {
    let source = rdkafka::mocking::MockCluster::new(1).unwrap();
    let target = rdkafka::mocking::MockCluster::new(1).unwrap();
    source.create_topic(TOPIC, PARTITIONS, 1).unwrap();
    target.create_topic(TOPIC, PARTITIONS, 1).unwrap();
    let (src, dst) = (source.bootstrap_servers(), target.bootstrap_servers());
    write_samples(&src, TOPIC, 0..records, PARTITIONS, 100).unwrap();
    let mut settings = Settings::new(
        ClientProps::from_pairs(
            Role::Consumer,
            "test consumer config",
            [
                ("bootstrap.servers", src.as_str()),
                ("group.id", "allocations"),
                ("session.timeout.ms", "6000"),
                ("heartbeat.interval.ms", "500"),
            ],
        ),
        ClientProps::from_pairs(
            Role::Producer,
            "test producer config",
            [("bootstrap.servers", dst.as_str())],
        ),
        TopicFilter::new(TOPIC).unwrap(),
        SettingsOptions {
            commit_interval: Duration::from_secs(1),
            ..SettingsOptions::default()
        },
    )
    .unwrap();
    if provenance {
        settings.provenance = Some(
            mirror_maker::settings::routing::Provenance::new(Some("east"), Some("west")).unwrap(),
        );
    }
    let control = Arc::new(Control::new());
    let stats = Arc::new(Stats::default());
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    std::thread::scope(|scope| {
        let mirror = {
            let (control, stats, settings) = (control.clone(), stats.clone(), &settings);
            scope.spawn(move || mirror_maker::mirror::pipeline::run(settings, control, stats))
        };
        let deadline = Instant::now() + Duration::from_secs(120);
        while Stats::get(&stats.acknowledged) < records {
            assert!(!mirror.is_finished(), "the mirror stopped early");
            assert!(
                Instant::now() < deadline,
                "the mirror did not finish in time"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        control.request_stop();
        mirror.join().unwrap().unwrap();
    });
    ALLOCATIONS.load(Ordering::Relaxed) - before
}

#[test]
fn mirroring_a_record_allocates_nothing_on_the_heap() {
    for provenance in [false, true] {
        let small = allocations_to_mirror(20_000, provenance);
        let large = allocations_to_mirror(120_000, provenance);
        let per_record = large.saturating_sub(small) as f64 / 100_000.0;
        eprintln!(
            "heap allocations (provenance headers {provenance}): 20,000 records {small}, \
             120,000 records {large}: {per_record:.3} per record"
        );
        // Periodic work (commits, metadata refreshes, a longer run's extra commits) allocates
        // a little; any allocation per record would add 1 (history: 2.006 with rust-rdkafka's
        // `send` and `poll`, 1.006 with `produce`, 0.003 with our own poll).
        assert!(per_record < 0.05, "{per_record:.3} allocations per record");
    }
}
