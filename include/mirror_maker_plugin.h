/*
 * mirror-maker plugin ABI, version 1.
 *
 * A plugin is a shared library exporting one entry symbol:
 *   const mm_handler_vtable  *mirror_maker_message_handler(void);     (--message.handler)
 *   const mm_listener_vtable *mirror_maker_rebalance_listener(void);  (--consumer.rebalance.listener)
 * returning a pointer to a static vtable with abi_version = MM_PLUGIN_ABI_VERSION and
 * struct_size = sizeof(the vtable). A library with another version or size is refused at
 * start-up (exit 2), as is one whose vtable has NULL for a required function, or whose init
 * returns non-zero.
 *
 * Required and optional functions: a handler's init and handle are required, its destroy is
 * optional (NULL: nothing to free). A listener's init is required; before_releasing_partitions,
 * before_starting_fetchers and destroy are optional (a NULL callback is skipped, as if it
 * returned 0). A NULL required function is refused at start-up (exit 2, naming the library
 * and the function).
 *
 * Where a library may come from: --message.handler and --consumer.rebalance.listener take a
 * path with a '/' (./libx.so or an absolute path; a bare name is refused, since dlopen would
 * look it up in the system's library path). The path is resolved (symlinks followed) and that
 * file is opened. The file, and every directory from it up to /, must be owned by root or the
 * user running the mirror and not be writable by group or others; a directory writable by
 * others with the sticky bit (/tmp, 1777) is accepted, since the sticky bit keeps others from
 * replacing what is inside. Otherwise the plugin is refused (exit 2, naming the path at fault).
 *
 * Limit of these checks: a library's constructors (__attribute__((constructor)), C++ static
 * initialisers) run inside dlopen, before the mirror can look up the entry symbol or read
 * abi_version; nothing can check a library before its constructors run. The ABI checks catch a
 * library built for another version, not a hostile one: the defence against that is where the
 * file may come from (above).
 *
 * Ownership: nothing allocated on one side is freed on the other.
 *   - Records, headers and partitions reach the plugin as borrowed views, valid only for the
 *     duration of the call.
 *   - A handler hands each output record to emit(emit_ctx, &record); the host copies it before
 *     emit returns, so the record may live on the plugin's stack.
 *   - Errors are written into the host's buffer with at most err->cap bytes of UTF-8; set
 *     err->len. Return non-zero to report the error.
 *
 * Threads: init is called once per mirror stream; an instance is used by one thread at a time
 * (possibly not the one that made it). destroy is called once per instance.
 *
 * C++ and other exceptions: no exception (nor a longjmp, nor a Rust panic) may leave a plugin
 * function; the ABI is plain C. Catch everything in each function (try { ... } catch (...)
 * { write err; return 1; }) and return non-zero. An exception that reaches the mirror is
 * undefined behaviour; what the mirror does today is abort ("Rust cannot catch foreign
 * exceptions", SIGABRT): no final commit, so records acknowledged since the last commit are
 * copied again on restart (duplicates, nothing lost).
 *
 * Semantics: a handler that emits nothing filters the record out (it counts as acknowledged);
 * a source record counts as acknowledged once every record emitted from it is. A non-zero
 * return from a listener callback stops the mirror (exit 1) after committing what was
 * acknowledged. A non-zero return from handle does what --on.handler.error says: stop (the
 * default: as a listener error, the record being handled not committed), skip (the record is
 * counted and left out), or dead-letter (the source record is copied to --dead.letter.topic).
 * Whatever handle emitted before returning non-zero is never sent.
 */
#ifndef MIRROR_MAKER_PLUGIN_H
#define MIRROR_MAKER_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MM_PLUGIN_ABI_VERSION 1u
#define MM_NO_TIMESTAMP (-1)   /* timestamp: none */
#define MM_ANY_PARTITION (-1)  /* output partition: let the mirror choose (--partitioning) */

/* A byte string. ptr == NULL means absent (null key or value); len == 0 with a non-NULL ptr
 * means empty. */
typedef struct mm_bytes {
    const uint8_t *ptr;
    size_t len;
} mm_bytes;

typedef struct mm_header {
    mm_bytes key;   /* never NULL; any bytes, as on the wire (Kafka does not require UTF-8) */
    mm_bytes value; /* may be NULL */
} mm_header;

typedef struct mm_record {
    mm_bytes topic;          /* UTF-8; on output, the target topic */
    int32_t partition;       /* on output, MM_ANY_PARTITION or a target partition */
    int64_t offset;          /* source offset (input only) */
    mm_bytes key;
    mm_bytes value;
    const mm_header *headers;
    size_t header_count;
    int64_t timestamp;       /* milliseconds since the epoch, or MM_NO_TIMESTAMP */
} mm_record;

typedef struct mm_partition {
    mm_bytes topic;
    int32_t partition;
} mm_partition;

typedef struct mm_error_buf {
    uint8_t *ptr;
    size_t cap;
    size_t len;
} mm_error_buf;

/* Copies one output record into the mirror. Returns 0, or non-zero if it was refused. */
typedef int32_t (*mm_emit_fn)(void *emit_ctx, const mm_record *record);

typedef struct mm_handler_vtable {
    uint32_t abi_version; /* MM_PLUGIN_ABI_VERSION */
    uint32_t struct_size; /* sizeof(mm_handler_vtable) */
    /* Required. */
    int32_t (*init)(mm_bytes args, void **instance, mm_error_buf *err);
    /* Required. */
    int32_t (*handle)(void *instance, const mm_record *record, mm_emit_fn emit, void *emit_ctx,
                      mm_error_buf *err);
    /* Optional: NULL if there is nothing to free. */
    void (*destroy)(void *instance);
} mm_handler_vtable;

typedef struct mm_listener_vtable {
    uint32_t abi_version; /* MM_PLUGIN_ABI_VERSION */
    uint32_t struct_size; /* sizeof(mm_listener_vtable) */
    /* Required. */
    int32_t (*init)(mm_bytes args, void **instance, mm_error_buf *err);
    /* Optional (NULL: skipped). After the mirror flushed and committed these partitions, before they are released. */
    int32_t (*before_releasing_partitions)(void *instance, const mm_partition *partitions,
                                           size_t count, mm_error_buf *err);
    /* Optional (NULL: skipped). After a new assignment, before any of its records is fetched. */
    int32_t (*before_starting_fetchers)(void *instance, mm_bytes consumer_id,
                                        const mm_partition *partitions, size_t count,
                                        mm_error_buf *err);
    /* Optional: NULL if there is nothing to free. */
    void (*destroy)(void *instance);
} mm_listener_vtable;

#ifdef __cplusplus
}
#endif

#endif /* MIRROR_MAKER_PLUGIN_H */
