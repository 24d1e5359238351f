// Command etcd is etcd's own main, built inside a module of ours: `go install` of etcd fails on the
// replace lines in etcd's go.mod, so we require go.etcd.io/etcd/server/v3 and call its entry point.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
