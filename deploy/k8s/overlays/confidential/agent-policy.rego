# The Kata agent policy of a confidential node's VM: what the untrusted host may ask the guest's
# agent to do. deploy/kata_policy.py renders it (the `release` line below) into initdata.toml,
# whose digest the host binds into SEV-SNP HOST_DATA / TDX MRCONFIGID and the clients' evidence
# policy pins (`kata_initdata`).
#
# The hardware report measures the VM (firmware, kernel, agent) and this policy, not the container
# the host later asks the agent to run. So the policy is what ties the attestation to the node's
# code: the only containers it admits are the pod's sandbox and the release's node image, pulled
# and checked by digest inside the guest, started with the release's exact command line, with no
# variable that injects code (the same rule the node applies to itself: cli/isolation.py), no OCI
# hook, and only the mounts a pod needs (none over the image's code). Exec, stdin, tracing and a
# new policy are refused; the node's stdout (content-free events) may be read.
package agent_policy

import future.keywords.every
import future.keywords.if
import future.keywords.in

default AddARPNeighborsRequest := true
default AddSwapRequest := true
default CloseStdinRequest := false
default CopyFileRequest := false
default CreateContainerRequest := false
default CreateSandboxRequest := true
default DestroySandboxRequest := true
default ExecProcessRequest := false
default GetMetricsRequest := true
default GetOOMEventRequest := true
default GuestDetailsRequest := true
default ListInterfacesRequest := true
default ListRoutesRequest := true
default MemHotplugByProbeRequest := true
default OnlineCPUMemRequest := true
default PauseContainerRequest := true
default PullImageRequest := true
default ReadStreamRequest := true
default RemoveContainerRequest := true
default RemoveStaleVirtiofsShareMountsRequest := true
default ReseedRandomDevRequest := true
default ResumeContainerRequest := true
default SetGuestDateTimeRequest := true
default SetPolicyRequest := false
default SignalProcessRequest := true
default StartContainerRequest := true
default StartTracingRequest := false
default StatsContainerRequest := true
default StopTracingRequest := false
default TtyWinResizeRequest := false
default UpdateContainerRequest := true
default UpdateEphemeralMountsRequest := false
default UpdateInterfaceRequest := true
default UpdateRoutesRequest := true
default WaitProcessRequest := true
default WriteStreamRequest := false
default AllowRequestsFailingPolicy := false

# {"image": "REPOSITORY@sha256:DIGEST", "args": [the node's whole command line]}, or null: a policy
# rendered for an image not pinned by digest admits no node container.
release := null

# Files the runtime shares into the guest (config maps, service account tokens, /etc/hosts) land
# under the sandbox's shared directory, never over the guest's own files.
CopyFileRequest if {
	startswith(input.path, "/run/kata-containers/shared/containers/")
	not contains(input.path, "..")
}

# The pod's sandbox ("pause") container.
CreateContainerRequest if {
	input.OCI.Annotations["io.kubernetes.cri.container-type"] == "sandbox"
	input.OCI.Process.Args == ["/pause"]
	common_ok
}

# The node: the release's image, pulled inside the guest, its exact command line.
CreateContainerRequest if {
	release != null
	input.OCI.Annotations["io.kubernetes.cri.container-type"] == "container"
	input.OCI.Annotations["io.kubernetes.cri.container-name"] == "node"
	input.OCI.Annotations["io.kubernetes.cri.image-name"] == release.image
	some storage in input.storages
	storage.driver == "image_guest_pull"
	storage.source == release.image
	input.OCI.Process.Args == release.args
	input.OCI.Root.Readonly == true
	common_ok
}

common_ok if {
	no_hooks
	every var in object.get(input.OCI.Process, "Env", []) {
		env_ok(var)
	}
	every mount in object.get(input.OCI, "Mounts", []) {
		mount_ok(mount)
	}
}

no_hooks if {
	hooks := object.get(input.OCI, "Hooks", null)
	hooks == null
}

no_hooks if {
	every _, list in input.OCI.Hooks {
		count(list) == 0
	}
}

# NAME=VALUE: no dynamic-loader or Python variable, but the allocator setting scrubbing needs.
env_ok(var) if {
	name := split(var, "=")[0]
	not startswith(name, "LD_")
	not startswith(name, "PYTHON")
	name != "GLIBC_TUNABLES"
}

env_ok(var) if {
	var == "PYTHONMALLOC=malloc"
}

# What a pod's container is given; /tmp is the node's memory-backed scratch volume.
mount_destinations := {
	"/proc", "/dev", "/dev/pts", "/dev/mqueue", "/dev/shm", "/sys", "/sys/fs/cgroup",
	"/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/dev/termination-log", "/tmp",
}

mount_ok(mount) if {
	mount.destination in mount_destinations
}
