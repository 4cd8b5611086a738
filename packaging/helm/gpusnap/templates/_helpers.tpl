{{/*
Object names: the release name, or RELEASE-gpusnap when the release name does not already say
gpusnap. With `helm install gpusnap ...` the objects are named as the kustomize base names them
(gpusnap-installer, gpusnap-config).
*/}}
{{- define "gpusnap.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "gpusnap.labels" -}}
app.kubernetes.io/name: gpusnap
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpusnap.installerSelector" -}}
app.kubernetes.io/name: gpusnap-installer
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* A TOML basic string: JSON's escapes (\", \\, \n, \uXXXX) are all valid TOML. */}}
{{- define "gpusnap.tomlString" -}}
{{- toJson (toString .) -}}
{{- end -}}

{{/* A byte size: an integer, or a string such as "64MiB" that gpusnap parses itself. */}}
{{- define "gpusnap.tomlBytes" -}}
{{- if kindIs "string" . -}}{{ toJson . }}{{- else -}}{{ int64 . }}{{- end -}}
{{- end -}}

{{/* Where the installer puts the Secrets' files on the node (read by the shim and gpusnap-runc). */}}
{{- define "gpusnap.hostKeysDir" -}}/etc/gpusnap/keys{{- end -}}
{{- define "gpusnap.hostSigningKey" -}}/etc/gpusnap/signing.key{{- end -}}
{{- define "gpusnap.hostRegistryDir" -}}/etc/gpusnap/registry{{- end -}}
{{- define "gpusnap.hostDecryptionKeysDir" -}}/etc/gpusnap/decryption-keys{{- end -}}
{{- define "gpusnap.hostRegistryCADir" -}}/etc/gpusnap/registry-ca{{- end -}}

{{/* Refuses values that would install a config the node then refuses, with the reason. */}}
{{- define "gpusnap.validate" -}}
{{- $sk := .Values.signatureKeys -}}
{{- if and $sk.secretName (not $sk.keys) -}}
{{- fail "signatureKeys.secretName is set: list the Secret's public-key entries in signatureKeys.keys" -}}
{{- end -}}
{{- if and $sk.keys (not $sk.secretName) -}}
{{- fail "signatureKeys.keys is set: name the Secret holding them in signatureKeys.secretName" -}}
{{- end -}}
{{- $dk := .Values.decryptionKeys -}}
{{- if and $dk.secretName (not $dk.keys) -}}
{{- fail "decryptionKeys.secretName is set: list the Secret's private-key entries in decryptionKeys.keys" -}}
{{- end -}}
{{- if and $dk.keys (not $dk.secretName) -}}
{{- fail "decryptionKeys.keys is set: name the Secret holding them in decryptionKeys.secretName" -}}
{{- end -}}
{{- $ca := .Values.registryCA -}}
{{- if and $ca.secretName (not $ca.keys) -}}
{{- fail "registryCA.secretName is set: list the Secret's CA certificate entries in registryCA.keys" -}}
{{- end -}}
{{- if and $ca.keys (not $ca.secretName) -}}
{{- fail "registryCA.keys is set: name the Secret holding them in registryCA.secretName" -}}
{{- end -}}
{{- $layout := include "gpusnap.layout" . | fromYaml -}}
{{- if hasPrefix "/opt/gpusnap/bin" (clean $layout.binDir) -}}
{{- fail "layout.binDir must not be /opt/gpusnap/bin: the image keeps its binaries there, and the node's directory mounted over it would hide them" -}}
{{- end -}}
{{- if and (ne (toString .Values.config.restore.signature_policy) "off") (not $sk.keys) -}}
{{- fail (printf "config.restore.signature_policy is %q: give the trusted public keys in signatureKeys (secretName, keys)" (toString .Values.config.restore.signature_policy)) -}}
{{- end -}}
{{- end -}}

{{/* /etc/gpusnap/config.toml as the node gets it. */}}
{{- define "gpusnap.configToml" -}}
{{- $c := .Values.config -}}
# gpusnap node configuration, rendered by the gpusnap Helm chart (release {{ .Release.Name }}).
# Installed as /etc/gpusnap/config.toml on every node after validation: a bad value stops the
# installer with a message naming the setting.

[storage]
engine = {{ include "gpusnap.tomlString" $c.storage.engine }}
transfer_buffer_count = {{ int64 $c.storage.transfer_buffer_count }}
transfer_chunk_bytes = {{ include "gpusnap.tomlBytes" $c.storage.transfer_chunk_bytes }}

[cuda]
max_operation_seconds = {{ int64 $c.cuda.max_operation_seconds }}
lock_timeout_ms = {{ int64 $c.cuda.lock_timeout_ms }}
restore_budget_seconds = {{ int64 $c.cuda.restore_budget_seconds }}
library = {{ include "gpusnap.tomlString" $c.cuda.library }}

[runc]
binary = {{ include "gpusnap.tomlString" $c.runc.binary }}
root = {{ include "gpusnap.tomlString" $c.runc.root }}
systemd_cgroup = {{ $c.runc.systemd_cgroup }}

[criu]
{{- with $c.criu.binary_dir }}
binary_dir = {{ include "gpusnap.tomlString" . }}
{{- end }}
{{- with $c.criu.min_version }}
min_version = {{ include "gpusnap.tomlString" . }}
{{- end }}

[restore]
checkpoint_root = {{ include "gpusnap.tomlString" $c.restore.checkpoint_root }}
criu_flags = {{ toJson (default (list) $c.restore.criu_flags) }}
signature_policy = {{ include "gpusnap.tomlString" $c.restore.signature_policy }}
{{- $keys := list }}
{{- range .Values.signatureKeys.keys }}
{{- $keys = append $keys (printf "%s/%s" (include "gpusnap.hostKeysDir" $) .) }}
{{- end }}
{{- with .Values.signatureKeys.secretName }}
# From Secret {{ . }}, installed by the installer (root, 0644).
{{- end }}
signature_keys = {{ toJson $keys }}
max_rootfs_diff_bytes = {{ include "gpusnap.tomlBytes" $c.restore.max_rootfs_diff_bytes }}
max_rootfs_diff_entries = {{ int64 (default 100000 $c.restore.max_rootfs_diff_entries) }}
max_volume_bytes = {{ include "gpusnap.tomlBytes" $c.restore.max_volume_bytes }}
{{- $dkeys := list }}
{{- range .Values.decryptionKeys.keys }}
{{- $dkeys = append $dkeys (printf "%s/%s" (include "gpusnap.hostDecryptionKeysDir" $) .) }}
{{- end }}
{{- with .Values.decryptionKeys.secretName }}
# From Secret {{ . }}, installed by the installer (root, 0600).
{{- end }}
decryption_keys = {{ toJson $dkeys }}
deadline_seconds = {{ int64 (default 0 $c.restore.deadline_seconds) }}
page_fill_min_bytes = {{ include "gpusnap.tomlBytes" (default 0 $c.restore.page_fill_min_bytes) }}
{{- if $c.store }}

[store]
root = {{ include "gpusnap.tomlString" $c.store.root }}
max_bytes = {{ include "gpusnap.tomlBytes" $c.store.max_bytes }}
{{- end }}

[checkpoint]
{{- with .Values.signingKey.secretName }}
# From Secret {{ . }}, installed by the installer (root, 0600).
signing_key = {{ include "gpusnap.tomlString" (include "gpusnap.hostSigningKey" $) }}
{{- end }}
# Where the installer may push the checkpoints of pods annotated gpusnap.io/checkpoint-to.
allowed_destinations = {{ toJson (default (list) $c.checkpoint.allowed_destinations) }}
{{- with .Values.registryCredentials.secretName }}
# From Secret {{ . }}, installed by the installer (root, 0600).
registry_config = {{ include "gpusnap.tomlString" (printf "%s/config.json" (include "gpusnap.hostRegistryDir" $)) }}
{{- end }}
{{- $cas := list }}
{{- range .Values.registryCA.keys }}
{{- $cas = append $cas (printf "%s/%s" (include "gpusnap.hostRegistryCADir" $) .) }}
{{- end }}
{{- with .Values.registryCA.secretName }}
# From Secret {{ . }}, installed by the installer (root, 0644).
{{- end }}
registry_ca_files = {{ toJson $cas }}
push_attempts = {{ int64 $c.checkpoint.push_attempts }}
push_retry_seconds = {{ int64 $c.checkpoint.push_retry_seconds }}
{{ end -}}

{{/*
Node layouts: where a node's containerd keeps its configuration (a file, or the template k3s and
RKE2 render config.toml from at each start), its socket, where the binaries go and how the
runtime is restarted (run in the host's mount namespace, no shell unless the command runs one).
*/}}
{{- define "gpusnap.presets" -}}
containerd:
  containerdConfig: /etc/containerd/config.toml
  containerdSocket: /run/containerd/containerd.sock
  binDir: /usr/local/bin
  restartCommand: systemctl restart containerd
k3s:
  containerdConfig: /var/lib/rancher/k3s/agent/etc/containerd/config-v3.toml.tmpl
  containerdSocket: /run/k3s/containerd/containerd.sock
  binDir: /usr/local/bin
  restartCommand: sh -c 'if systemctl is-active -q k3s; then systemctl restart k3s; else systemctl restart k3s-agent; fi'
rke2:
  containerdConfig: /var/lib/rancher/rke2/agent/etc/containerd/config-v3.toml.tmpl
  containerdSocket: /run/k3s/containerd/containerd.sock
  binDir: /usr/local/bin
  restartCommand: sh -c 'if systemctl is-active -q rke2-server; then systemctl restart rke2-server; else systemctl restart rke2-agent; fi'
{{- end -}}

{{/* The node layout in force: the preset, with every non-empty layout value over it. */}}
{{- define "gpusnap.layout" -}}
{{- $presets := include "gpusnap.presets" . | fromYaml -}}
{{- $l := .Values.layout -}}
{{- $p := get $presets $l.preset -}}
{{- $out := dict -}}
{{- range $k := list "containerdConfig" "containerdSocket" "binDir" "restartCommand" -}}
{{- $_ := set $out $k (default (get $p $k) (get $l $k)) -}}
{{- end -}}
{{- toYaml $out -}}
{{- end -}}

{{/* The installer's nodes: nodeSelector as given, else GPU nodes (a default map would merge
with the user's own selector, Helm merging maps, and schedule nowhere without that label). */}}
{{- define "gpusnap.nodeSelector" -}}
{{- if .Values.nodeSelector -}}
{{- toYaml .Values.nodeSelector -}}
{{- else -}}
nvidia.com/gpu.present: "true"
{{- end -}}
{{- end -}}

{{/* Pods of the RuntimeClass land on nodes the installer found ready (the label it sets), or,
with the label off, wherever the installer runs. */}}
{{- define "gpusnap.runtimeClassSelector" -}}
{{- if .Values.runtimeClass.nodeSelector -}}
{{- toYaml .Values.runtimeClass.nodeSelector -}}
{{- else if .Values.nodeLabel.enabled -}}
gpusnap.io/ready: "true"
{{- else -}}
{{- include "gpusnap.nodeSelector" . -}}
{{- end -}}
{{- end -}}

{{- define "gpusnap.serviceAccountName" -}}
{{- include "gpusnap.fullname" . }}-installer
{{- end -}}
