// SPDX-License-Identifier: Apache-2.0

package installed

// bySlowest is every test of the suite, slowest first as the last measured run had them (docs/results.md):
// `make test-integration` runs the suite as INSTALLED_SHARDS shards side by side, each on a cluster of its
// own, and devclustertest.Deal deals this list to them back and forth so that each shard gets one of the
// slowest, one of the next, and so on. A test missing here still runs in exactly one shard, but
// TestShardsDealEveryTest fails until it is listed where its time puts it.
var bySlowest = []string{
	"TestUpgrade",
	"TestFloodWithOneNodesTokenLeavesOtherNodesConnected",
	"TestPoolOnRealNodes",
	"TestPoolWaitsForItsMaintenanceWindow",
	"TestPoolWaitsForPodsReadyAgain",
	"TestPoolRefusesAConfigThatFailsPods",
	"TestPoolKeepsPodDisruptionBudgets",
	"TestANewEvictionThresholdWaitsForADrain",
	"TestPerNodeValuesOnRealNodes",
	"TestAConfigThatFailsPodsWaitsForADrain",
	"TestPoolPreviewsOnANodeItCannotJudge",
	"TestHelmInstall",
	"TestAssignDrainToTheStaticCPUManager",
	"TestPoolDrainsForTheStaticCPUManager",
	"TestSidecarRollingUpdate",
	"TestSidecarRestartedDuringAnAPIServerOutage",
	"TestUninstall",
	"TestSnapshotRecreatedIsNotServed",
	"TestUninstallRefusesABrokenLocalConfig",
	"TestNodesMovingBetweenReplicas",
	"TestSnapshotRecreatedWithItsDataIsNotServed",
	"TestServerPodsDeletedWhileAssignmentsChange",
	"TestKubeletUpgradedInPlaceToAMinorThatRefusesItsConfig",
	"TestKubeletUpgradedInPlaceKeepsItsConfig",
	"TestConfigDirDropInOverridingAFieldIsDrift",
	"TestDriftRestoredOnceWithinThePool",
	"TestKubeletSkew",
	"TestKubeadmRewritingTheLocalConfigIsNotDrift",
	"TestSidecarStoppedDuringHealthWait",
	"TestDedicatedConfigNamespace",
	"TestSystemBusRestartedDuringAKubeletRestart",
	"TestNodeDeletedAndRejoined",
	"TestDriftReportedWhenTheWiringIsRemoved",
	"TestInstalledFormRunsAsPods",
	"TestNodeStatusCannotBeForged",
	"TestGrpcurlThroughPortForward",
	"TestSnapshotPreCreatedIsRefused",
	"TestPoolOverANodeWithoutASidecarCompletes",
	"TestMetricsNeedAToken",
	"TestContractPaths",
	"TestSidecarPodsHoldOnlyWhatTheyNeed",
	"TestNoWorkerCredentialCanAssignAConfig",
	"TestServerPDBLetsDrainsEvictUnhealthyReplicas",
}
