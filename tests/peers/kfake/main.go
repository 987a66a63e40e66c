// kfake: franz-go's in-memory Kafka cluster (github.com/twmb/franz-go/pkg/kfake), an
// independent implementation of the Kafka protocol, as a test peer of mirror-maker
// (tests/kfake.rs, docs/testing.md). One broker on 127.0.0.1:PORT until SIGTERM or SIGINT;
// the address is printed once it listens.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	port := flag.Int("port", 0, "the port to listen on (0: any)")
	cluster := flag.String("cluster-id", "kfake", "the cluster id")
	flag.Parse()
	c, err := kfake.NewCluster(kfake.Ports(*port), kfake.ClusterID(*cluster))
	if err != nil {
		fmt.Fprintf(os.Stderr, "kfake: %v\n", err)
		os.Exit(1)
	}
	defer c.Close()
	fmt.Println(c.ListenAddrs()[0])
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
