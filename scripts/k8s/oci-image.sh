# shellcheck shell=bash
# Container images with no registry and no image builder: a directory packed by hand
# as a one-layer OCI image archive, which `ctr images import` takes (sourced).

# oci_archive NAME ROOTFS OUT CMD...: writes OUT, an OCI image layout in a tar, of one
# uncompressed layer holding ROOTFS (owned by root, timestamps zeroed: the same files
# give the same image id), named NAME (e.g. localhost/themis/pause:3.10), running CMD
# (as OCI_USER, e.g. 1337:1337, if set; root otherwise).
oci_archive() { # NAME ROOTFS OUT CMD...
    local name=$1 rootfs=$2 out=$3 layout layer config manifest diff_id cmd_json user_json=
    shift 3
    layout=$(mktemp -d)
    mkdir -p "$layout/blobs/sha256"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$rootfs" -cf "$layout/layer.tar" .
    diff_id=$(sha256sum < "$layout/layer.tar" | cut -d' ' -f1)
    mv "$layout/layer.tar" "$layout/blobs/sha256/$diff_id"
    cmd_json=$(printf '"%s",' "$@") && cmd_json="[${cmd_json%,}]"
    [[ -z ${OCI_USER:-} ]] || user_json="\"User\":\"$OCI_USER\","
    config=$(oci_blob "$layout" "$(printf '{"architecture":"%s","os":"linux","config":{%s"Entrypoint":%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"WorkingDir":"/"},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
        "$(dpkg --print-architecture)" "$user_json" "$cmd_json" "$diff_id")")
    layer="{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar\",\"digest\":\"sha256:$diff_id\",\"size\":$(stat -c %s "$layout/blobs/sha256/$diff_id")}"
    manifest=$(oci_blob "$layout" "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\",$config},\"layers\":[$layer]}")
    printf '%s' '{"imageLayoutVersion":"1.0.0"}' > "$layout/oci-layout"
    # io.containerd.image.name is the name `ctr images import` gives the image.
    printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json",%s,"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"}}]}' \
        "$manifest" "$name" "${name##*:}" > "$layout/index.json"
    tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$layout" -cf "$out" oci-layout index.json blobs
    rm -rf "$layout"
}

# oci_blob LAYOUT JSON: stores JSON as a blob; prints '"digest":"sha256:…","size":N'.
oci_blob() { # LAYOUT JSON
    local digest
    digest=$(printf '%s' "$2" | sha256sum | cut -d' ' -f1)
    printf '%s' "$2" > "$1/blobs/sha256/$digest"
    printf '"digest":"sha256:%s","size":%s' "$digest" "${#2}"
}
