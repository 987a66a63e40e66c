//! The source consumer's context of an exactly-once stream: rebalances run the hand-over.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use rdkafka::consumer::{Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::topic_partition_list::TopicPartitionList;
use rdkafka::types::RDKafkaRespErr;

use crate::mirror::source::{committed, partition_list, source_client_context};
use crate::mirror::state::Stats;

use super::transaction::TxShared;
use super::TxConsumer;

/// The consumer's context: rebalances run the transactional hand-over.
pub(crate) struct TxSourceContext {
    pub(super) core: Arc<TxShared>,
}

// In exactly-once mode a record is on the target once its transaction committed: what the
// partition's last committed progress has not passed is missing there. (Not waited for if
// the loop holds the state: the consumer's position stands in for one statistics.)
source_client_context!(
    TxSourceContext,
    |context| &context.core.shared,
    |context, topic, partition| {
        let mut state = context.core.state.try_lock().ok()?;
        state.find(topic, partition).and_then(|p| p.committed)
    }
);

impl ConsumerContext for TxSourceContext {
    /// Revocations commit (releasing the partitions) before the partitions go; assignments
    /// fence, read the store and start each partition at its progress.
    fn rebalance(&self, consumer: &TxConsumer, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        let core = &self.core;
        let cooperative = matches!(
            consumer.rebalance_protocol(),
            RebalanceProtocol::Cooperative
        );
        let result = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                core.assign(tpl);
                let result = if cooperative {
                    consumer.incremental_assign(tpl)
                } else {
                    consumer.assign(tpl)
                };
                let pending = core.state().pending.clone();
                if !pending.is_empty() {
                    let mut paused = TopicPartitionList::new();
                    for (topic, partition) in &pending {
                        paused.add_partition(topic, *partition);
                    }
                    if let Err(e) = consumer.pause(&paused) {
                        core.state().broken = true;
                        core.shared.control.fail(format!(
                            "stream {}: cannot pause the partitions whose start is pending: \
                             {e}; stopping",
                            core.stream
                        ));
                    }
                }
                let partitions = partition_list(tpl);
                core.shared.took(&partitions);
                if !partitions.is_empty() {
                    let id = crate::native::member_id(consumer);
                    core.call_listener("before_starting_fetchers", |l| {
                        l.before_starting_fetchers(&id, &partitions)
                    });
                }
                core.shared.assigned.store(true, Ordering::SeqCst);
                result
            }
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => {
                let partitions = partition_list(tpl);
                core.shared.released(&partitions);
                core.revoke(consumer, &partitions);
                if !partitions.is_empty() {
                    core.call_listener("before_releasing_partitions", |l| {
                        l.before_releasing_partitions(&partitions)
                    });
                }
                if cooperative {
                    consumer.incremental_unassign(tpl)
                } else {
                    consumer.unassign()
                }
            }
            other => {
                tracing::warn!(
                    stream = core.stream,
                    "rebalance error: {}",
                    KafkaError::Rebalance(other.into())
                );
                if cooperative {
                    Ok(())
                } else {
                    consumer.unassign()
                }
            }
        };
        Stats::add(&core.shared.stats.rebalances, 1);
        if let Err(e) = result {
            tracing::warn!(stream = core.stream, "applying the rebalance: {e}");
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        committed(&self.core.shared, &result, offsets.count());
    }
}
