// Command etcdget prints the size of etcd values, or with -value the
// values themselves: what scripts measure of the records Cumulus keeps.
//
//	go run ./scripts/etcdget [-value] [-rev] ENDPOINT KEY...
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	value := flag.Bool("value", false, "print the values, not their sizes")
	rev := flag.Bool("rev", false, "print etcd's revision and each key's modification revision too")
	flag.Parse()
	if flag.NArg() < 2 {
		fmt.Fprintln(os.Stderr, "usage: etcdget [-value] ENDPOINT KEY...")
		os.Exit(2)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{flag.Arg(0)}, DialTimeout: 5 * time.Second})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	defer cli.Close()
	for _, key := range flag.Args()[1:] {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		resp, err := cli.Get(ctx, key)
		cancel()
		switch {
		case err != nil:
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		case len(resp.Kvs) == 0:
			fmt.Printf("%s absent\n", key)
		case *value:
			fmt.Printf("%s\n", resp.Kvs[0].Value)
		default:
			fmt.Printf("%s %d bytes\n", key, len(resp.Kvs[0].Value))
		}
		if *rev && len(resp.Kvs) > 0 {
			fmt.Printf("%s revision %d, modified at %d (version %d)\n", key, resp.Header.Revision, resp.Kvs[0].ModRevision, resp.Kvs[0].Version)
		}
	}
}
