"""The images `make images` (hack/build-images.sh) builds into podman's store, as kubelet nodes run them."""

OPERATOR_IMAGE = "localhost/rtj-operator:local"
TRAINER_IMAGE = "localhost/rtj-trainer:cpu-local"
#: trainer-image/Dockerfile's USER: a hostPath checkpoint volume must be writable by it (hostPath
#: ignores fsGroup).
TRAINER_UID = 10001
