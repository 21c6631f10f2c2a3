// SPDX-License-Identifier: Apache-2.0

//go:build !integration

package installed

import (
	"testing"

	"github.com/dkc-dev/dkc/test/devcluster/devclustertest"
)

// TestShardsDealEveryTest holds bySlowest to the suite's tests.
func TestShardsDealEveryTest(t *testing.T) { devclustertest.CheckShardList(t, bySlowest) }
