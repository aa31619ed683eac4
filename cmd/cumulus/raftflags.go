package main

import (
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/cumulus-serving/cumulus/internal/raftgroup"
	"github.com/cumulus-serving/cumulus/internal/tlsconf"
	"github.com/cumulus-serving/cumulus/manager"
)

// raftFlags make a manager a member of a raft group of managers.
type raftFlags struct {
	id, addr, advertise, dir, peers string
	auditKeep                       int
	auditAge                        time.Duration
}

func (f *raftFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.id, "raft-id", "", "this manager's ID in the raft group of managers (default: the host name, a StatefulSet pod's name)")
	fs.StringVar(&f.addr, "raft-addr", "", "address the raft transport listens on and peers dial (HOST:PORT); with --raft-dir, the managers keep their state in a raft group rather than in etcd")
	fs.StringVar(&f.advertise, "raft-advertise", "", "address peers dial this member at, when not --raft-addr (which listens on 0.0.0.0, say): a StatefulSet pod's DNS name and port")
	fs.StringVar(&f.dir, "raft-dir", "", "directory of this member's raft log, stable store and snapshots (on disk, kept across restarts)")
	fs.StringVar(&f.peers, "raft-peers", "", "ID=HOST:PORT,...: the group's members, to bootstrap a fresh group (ignored once --raft-dir holds state); empty: wait to be added (cumulus admin managers add)")
	fs.IntVar(&f.auditKeep, "audit-keep", 100_000, "with --raft-*: audit entries kept (the newest)")
	fs.DurationVar(&f.auditAge, "audit-max-age", 90*24*time.Hour, "with --raft-*: audit entries older than this are dropped")
}

// options are the manager's raft options, nil without --raft-dir and
// --raft-addr; the transport is mutual TLS with the manager's --tls-*.
func (f *raftFlags) options(cmd *cobra.Command, tls *tlsconf.Source) (*manager.RaftOptions, error) {
	switch {
	case f.addr == "" && f.dir == "":
		for _, name := range []string{"raft-id", "raft-advertise", "raft-peers", "audit-keep", "audit-max-age"} {
			if cmd.Flags().Changed(name) {
				return nil, fmt.Errorf("--%s: give --raft-addr and --raft-dir too", name)
			}
		}
		return nil, nil
	case f.addr == "" || f.dir == "":
		return nil, errors.New("a raft member needs both --raft-addr and --raft-dir")
	}
	id := f.id
	if id == "" {
		host, err := os.Hostname()
		if err != nil {
			return nil, fmt.Errorf("--raft-id: %w", err)
		}
		id = host
	}
	if err := raftgroup.ValidID(id); err != nil {
		return nil, fmt.Errorf("--raft-id: %w", err)
	}
	peers, err := raftgroup.ParsePeers(f.peers)
	if err != nil {
		return nil, fmt.Errorf("--raft-peers: %w", err)
	}
	if f.auditKeep < 1 || f.auditAge <= 0 {
		return nil, errors.New("--audit-keep and --audit-max-age must be positive")
	}
	return &manager.RaftOptions{ID: id, Addr: f.addr, Advertise: f.advertise, Dir: f.dir, Peers: peers, TLS: tls,
		Audit: manager.AuditRetention{Keep: f.auditKeep, MaxAge: f.auditAge}}, nil
}
