//! What a cluster lets this client's principal do with topics: librdkafka's DescribeTopics
//! with `include_authorized_operations` (KIP-430; the brokers answer from their authorizer),
//! which rust-rdkafka does not wrap.

use std::ffi::{CStr, CString};
use std::time::Duration;

use rdkafka::bindings as rdsys;
use rdkafka::client::{Client, ClientContext};
use rdkafka::error::RDKafkaErrorCode;

use super::NativePtr;

/// One topic as DescribeTopics returned it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicOperations {
    pub topic: String,
    /// The topic's error (e.g. `TopicAuthorizationFailed`, `UnknownTopicOrPartition`).
    pub error: Option<RDKafkaErrorCode>,
    /// The operations the principal may perform on the topic, as Kafka names them (`READ`,
    /// `WRITE`, `DESCRIBE`, ...); `None` when the cluster did not say (no authorizer
    /// information, or an error).
    pub operations: Option<Vec<String>>,
}

/// The authorized operations on `topics`, asked of the cluster `client` is connected to,
/// waiting at most `timeout`. `Err` holds librdkafka's reason for a failed request.
pub fn authorized_operations<C: ClientContext>(
    client: &Client<C>,
    topics: &[&str],
    timeout: Duration,
) -> Result<Vec<TopicOperations>, String> {
    let names: Vec<CString> = topics
        .iter()
        .map(|t| CString::new(*t).map_err(|_| format!("topic name {t:?} holds a NUL byte")))
        .collect::<Result<_, _>>()?;
    let mut pointers: Vec<*const std::ffi::c_char> = names.iter().map(|n| n.as_ptr()).collect();
    // DescribeTopics goes to the controller: a cluster that names none among its brokers
    // (librdkafka's mock cluster says 0) would leave the request waiting for one.
    let metadata = client
        .fetch_metadata(None, timeout)
        .map_err(|e| e.to_string())?;
    let rk = client.native_ptr();
    // SAFETY: `rk` is a live client while `client` is borrowed; a zero timeout only reads the
    // id learnt from the metadata fetched above.
    let controller = unsafe { rdsys::rd_kafka_controllerid(rk, 0) };
    if !metadata.brokers().iter().any(|b| b.id() == controller) {
        return Err(format!(
            "the cluster names no controller among its brokers (controller id {controller})"
        ));
    }
    let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // SAFETY: `rk` is a live client while `client` is borrowed. Every handle made here is
    // owned by a NativePtr and released once; `pointers` and `names` outlive the calls that
    // read them (librdkafka copies the names into the collection). The result's descriptions
    // belong to `event` and are read before it is released.
    unsafe {
        let queue =
            NativePtr::from_ptr(rdsys::rd_kafka_queue_new(rk)).ok_or("librdkafka made no queue")?;
        let options = NativePtr::from_ptr(rdsys::rd_kafka_AdminOptions_new(
            rk,
            rdsys::rd_kafka_admin_op_t::RD_KAFKA_ADMIN_OP_DESCRIBETOPICS,
        ))
        .ok_or("librdkafka made no admin options")?;
        let mut errstr = [0 as std::ffi::c_char; 256];
        let code = rdsys::rd_kafka_AdminOptions_set_request_timeout(
            options.ptr(),
            timeout_ms,
            errstr.as_mut_ptr(),
            errstr.len(),
        );
        if code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            return Err(CStr::from_ptr(errstr.as_ptr())
                .to_string_lossy()
                .into_owned());
        }
        let error =
            rdsys::rd_kafka_AdminOptions_set_include_authorized_operations(options.ptr(), 1);
        if !error.is_null() {
            let reason = CStr::from_ptr(rdsys::rd_kafka_error_string(error))
                .to_string_lossy()
                .into_owned();
            rdsys::rd_kafka_error_destroy(error);
            return Err(reason);
        }
        let collection = NativePtr::from_ptr(rdsys::rd_kafka_TopicCollection_of_topic_names(
            pointers.as_mut_ptr(),
            pointers.len(),
        ))
        .ok_or("librdkafka made no topic collection")?;
        rdsys::rd_kafka_DescribeTopics(rk, collection.ptr(), options.ptr(), queue.ptr());
        // The request's own timeout answers first; the margin only guards against a lost
        // reply.
        let event = NativePtr::from_ptr(rdsys::rd_kafka_queue_poll(
            queue.ptr(),
            timeout_ms.saturating_add(1000),
        ))
        .ok_or_else(|| format!("no answer to DescribeTopics within {timeout:?}"))?;
        if rdsys::rd_kafka_event_error(event.ptr())
            != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR
        {
            let reason = rdsys::rd_kafka_event_error_string(event.ptr());
            return Err(if reason.is_null() {
                "DescribeTopics failed".to_owned()
            } else {
                CStr::from_ptr(reason).to_string_lossy().into_owned()
            });
        }
        let result = rdsys::rd_kafka_event_DescribeTopics_result(event.ptr());
        if result.is_null() {
            return Err("DescribeTopics returned no result".to_owned());
        }
        let mut count = 0usize;
        let descriptions = rdsys::rd_kafka_DescribeTopics_result_topics(result, &mut count);
        let mut out = Vec::with_capacity(count);
        for i in 0..count {
            let description = *descriptions.add(i);
            let name = rdsys::rd_kafka_TopicDescription_name(description);
            let topic = if name.is_null() {
                String::new()
            } else {
                CStr::from_ptr(name).to_string_lossy().into_owned()
            };
            let error = rdsys::rd_kafka_TopicDescription_error(description);
            let error = if error.is_null() {
                None
            } else {
                let code = rdsys::rd_kafka_error_code(error);
                (code != rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR)
                    .then(|| RDKafkaErrorCode::from(code))
            };
            let mut n = 0usize;
            let ops = rdsys::rd_kafka_TopicDescription_authorized_operations(description, &mut n);
            let operations = (!ops.is_null()).then(|| {
                (0..n)
                    .map(|j| {
                        let name = rdsys::rd_kafka_AclOperation_name(*ops.add(j));
                        if name.is_null() {
                            "UNKNOWN".to_owned()
                        } else {
                            CStr::from_ptr(name).to_string_lossy().into_owned()
                        }
                    })
                    .collect()
            });
            out.push(TopicOperations {
                topic,
                error,
                operations,
            });
        }
        drop(collection);
        drop(options);
        drop(event);
        drop(queue);
        Ok(out)
    }
}
