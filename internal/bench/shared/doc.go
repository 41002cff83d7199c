// Package shared is `kvcm bench shared`: the shared tier's write and
// lookup+read throughput beside the Redis Cluster's raw pipelined SET/GET
// throughput at the same value sizes, measured in the same run.
package shared
