// Command cumulus serves huge sparse models.
//
//	cumulus dev                 whole cluster on localhost (embedded etcd)
//	cumulus shard|router|manager one process of a real cluster
//	cumulus model import|gen|inspect
//	cumulus predict             score libsvm or JSON lines
//	cumulus bench               load generator (rank200, small)
//
// Only this package parses flags.
package main
