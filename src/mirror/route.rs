//! Where a consumed record goes, for both stream kinds: nowhere (it came from the target, or
//! the message handler filtered it out), as it is, or as the handler made it; and the
//! outgoing records that makes, in order.

use crate::native::produce::{Outgoing, RawHeaders};
use crate::native::record::Record;
use crate::plugin::{Emitted, Handler};
use crate::settings::flags::Partitioning;
use crate::settings::routing::PROVENANCE_HEADER;
use crate::settings::{OnHandlerError, Settings};

use super::state::{Stats, StreamShared};

/// The headers a dead-lettered record (`--on.handler.error dead-letter`) carries after its
/// own: the handler's error and the record's source position.
pub const DEAD_LETTER_ERROR_HEADER: &str = "mirror-handler-error";
pub const DEAD_LETTER_TOPIC_HEADER: &str = "mirror-source-topic";
pub const DEAD_LETTER_PARTITION_HEADER: &str = "mirror-source-partition";
pub const DEAD_LETTER_OFFSET_HEADER: &str = "mirror-source-offset";

/// How a stream ended.
#[derive(Debug, Default)]
pub struct StreamReport {
    /// Records still unacknowledged when the shutdown flush gave up.
    pub unacknowledged: usize,
}

/// Where a record goes: nowhere (it came from the target, or the handler filtered it
/// out), as it is, or as the handler made it. `None` if the handler failed (fatal).
pub(crate) fn route<'h>(
    settings: &Settings,
    shared: &StreamShared,
    record: &Record<'_>,
    handler: Option<&'h mut Handler>,
) -> Option<Route<'h>> {
    let stats = &shared.stats;
    if let Some(p) = &settings.provenance {
        if p.came_from_target(record.headers()) {
            Stats::add(&stats.looped, 1);
            return Some(Route::Skip);
        }
    }
    let Some(handler) = handler else {
        return Some(Route::AsItIs);
    };
    match handler.handle(record) {
        Ok([]) => {
            Stats::add(&stats.filtered, 1);
            Some(Route::Skip)
        }
        Ok(outputs) => Some(Route::Handled(outputs)),
        Err(e) => {
            let path = settings.handler.as_ref().map(|h| h.path().display());
            let path = path.map_or_else(String::new, |p| p.to_string());
            let (topic, partition, offset) = (record.topic(), record.partition(), record.offset());
            let (action, label, route) = match &settings.on_handler_error {
                OnHandlerError::Stop => {
                    shared.control.fail(format!(
                        "the message handler {path} failed on {topic}/{partition} offset \
                         {offset}: {e}. To go past records it refuses, restart with \
                         --on.handler.error skip or dead-letter"
                    ));
                    return None;
                }
                OnHandlerError::Skip => (
                    "skipped (--on.handler.error skip)".to_owned(),
                    "skip",
                    Route::Skip,
                ),
                OnHandlerError::DeadLetter(to) => (
                    format!(
                        "copied to the dead-letter topic {to} (--on.handler.error dead-letter)"
                    ),
                    "dead-letter",
                    Route::DeadLetter(e.clone()),
                ),
            };
            shared.stats.recorded.count_handler_refused(topic, label);
            let allowed = shared
                .refusals_logged
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .allow(std::time::Instant::now());
            if let Some(held_back) = allowed {
                let note = match held_back {
                    0 => String::new(),
                    1 => " (1 more refused record not logged since the last line)".to_owned(),
                    n => format!(" ({n} more refused records not logged since the last line)"),
                };
                tracing::warn!(
                    stream = shared.stream,
                    "the message handler {path} refused {topic}/{partition} offset {offset}: \
                     {e}; {action}{note}"
                );
            }
            Some(route)
        }
    }
}

/// The headers of an outgoing record, with the provenance header under
/// `--loop.prevention true`.
pub(crate) fn stamped(settings: &Settings, mut headers: RawHeaders) -> RawHeaders {
    if let Some(p) = &settings.provenance {
        headers.add(PROVENANCE_HEADER.as_bytes(), Some(p.source.as_bytes()));
    }
    headers
}

/// The target partition `--partitioning` gives a record: the same number (preserve), or
/// none for the producer's partitioner to choose (hash).
pub(crate) fn same_partition(settings: &Settings, record: &Record<'_>) -> Option<i32> {
    match settings.options.partitioning {
        Partitioning::Preserve => Some(record.partition()),
        Partitioning::Hash => None,
    }
}

/// What becomes of one consumed record.
pub(crate) enum Route<'h> {
    /// Not mirrored; acknowledged at once.
    Skip,
    /// Mirrored as it is.
    AsItIs,
    /// What the message handler made of it (at least one record).
    Handled(&'h [Emitted]),
    /// Refused by the handler with this error, and copied as it is to the dead-letter topic
    /// (`--on.handler.error dead-letter`).
    DeadLetter(String),
}

/// Where an outgoing record goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Destination<'a> {
    /// The target topic of this source-side topic (`--target.topic` applies to it).
    Mirrored(&'a str),
    /// This target topic, as it is (`--dead.letter.topic`).
    DeadLetter(&'a str),
}

impl Destination<'_> {
    /// The topic's name, for messages: the source-side one for a mirrored record.
    pub(crate) fn name(&self) -> &str {
        match self {
            Destination::Mirrored(t) | Destination::DeadLetter(t) => t,
        }
    }
}

impl Route<'_> {
    /// How many target records the routed record becomes.
    pub(crate) fn len(&self) -> usize {
        match self {
            Route::Skip => 0,
            Route::AsItIs | Route::DeadLetter(_) => 1,
            Route::Handled(outputs) => outputs.len(),
        }
    }
}

/// The outgoing records `route` makes of `record`, in order, each with its destination (the
/// source-side topic whose target it goes to, or the dead-letter topic) and, from `opaque`,
/// called once per record as it is made, the opaque of its delivery report.
pub(crate) fn outgoing<'r>(
    settings: &'r Settings,
    record: &'r Record<'_>,
    route: &'r Route<'r>,
    mut opaque: impl FnMut() -> usize + 'r,
) -> impl Iterator<Item = (Destination<'r>, Outgoing<'r>)> + 'r {
    let mut as_it_is = matches!(route, Route::AsItIs).then_some(());
    let mut dead_letter = match (route, &settings.on_handler_error) {
        (Route::DeadLetter(error), OnHandlerError::DeadLetter(to)) => Some((error, to)),
        _ => None,
    };
    let handled: &'r [Emitted] = match route {
        Route::Handled(outputs) => outputs,
        _ => &[],
    };
    let mut handled = handled.iter();
    std::iter::from_fn(move || {
        if as_it_is.take().is_some() {
            return Some((
                Destination::Mirrored(record.topic()),
                Outgoing {
                    partition: same_partition(settings, record),
                    key: record.key(),
                    value: record.payload(),
                    timestamp: record.timestamp(),
                    headers: stamped(settings, record.copy_headers()),
                    opaque: opaque(),
                },
            ));
        }
        if let Some((error, to)) = dead_letter.take() {
            return Some((
                Destination::DeadLetter(to),
                Outgoing {
                    // The dead-letter topic's partitions are not the source's.
                    partition: None,
                    key: record.key(),
                    value: record.payload(),
                    timestamp: record.timestamp(),
                    headers: stamped(settings, dead_letter_headers(record, error)),
                    opaque: opaque(),
                },
            ));
        }
        let out = handled.next()?;
        let mut headers = RawHeaders::none();
        for (key, value) in &out.headers {
            headers.add(key, value.as_deref());
        }
        Some((
            Destination::Mirrored(out.topic.as_str()),
            Outgoing {
                partition: out.partition.or(same_partition(settings, record)),
                key: out.key.as_deref(),
                value: out.value.as_deref(),
                timestamp: out.timestamp,
                headers: stamped(settings, headers),
                opaque: opaque(),
            },
        ))
    })
}

/// A refused record's own headers, then the handler's error and the record's source topic,
/// partition and offset (as decimal text).
fn dead_letter_headers(record: &Record<'_>, error: &str) -> RawHeaders {
    let mut headers = record.copy_headers();
    headers.add(DEAD_LETTER_ERROR_HEADER.as_bytes(), Some(error.as_bytes()));
    headers.add(
        DEAD_LETTER_TOPIC_HEADER.as_bytes(),
        Some(record.topic().as_bytes()),
    );
    headers.add(
        DEAD_LETTER_PARTITION_HEADER.as_bytes(),
        Some(record.partition().to_string().as_bytes()),
    );
    headers.add(
        DEAD_LETTER_OFFSET_HEADER.as_bytes(),
        Some(record.offset().to_string().as_bytes()),
    );
    headers
}
