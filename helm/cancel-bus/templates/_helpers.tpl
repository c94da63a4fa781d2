{{/* Names and labels, as `helm create` makes them. */}}
{{- define "cancel-bus.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cancel-bus.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "cancel-bus.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "cancel-bus.commonLabels" -}}
helm.sh/chart: {{ include "cancel-bus.chart" . }}
{{- if .Chart.AppVersion }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "cancel-bus.labels" -}}
{{ include "cancel-bus.commonLabels" . }}
{{ include "cancel-bus.selectorLabels" . }}
{{- end }}

{{- define "cancel-bus.selectorLabels" -}}
app.kubernetes.io/name: {{ include "cancel-bus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end }}

{{/* The in-chart Redis (not for production) has its own component label. */}}
{{- define "cancel-bus.redisLabels" -}}
{{ include "cancel-bus.commonLabels" . }}
{{ include "cancel-bus.redisSelectorLabels" . }}
{{- end }}

{{- define "cancel-bus.redisSelectorLabels" -}}
app.kubernetes.io/name: {{ include "cancel-bus.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: redis
{{- end }}

{{- define "cancel-bus.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "cancel-bus.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Pods carrying this label may reach the nodes' HTTP port through the NetworkPolicy. */}}
{{- define "cancel-bus.clientLabel" -}}
cancel-bus.io/client-of: {{ include "cancel-bus.fullname" . }}
{{- end }}

{{- define "cancel-bus.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}
{{- end }}

{{/* The chart's Secret (tokens, signing key, Redis password) exists unless all come from elsewhere. */}}
{{- define "cancel-bus.secretName" -}}
{{- include "cancel-bus.fullname" . }}
{{- end }}

{{- define "cancel-bus.ownsTokens" -}}
{{- if not .Values.auth.existingSecret }}true{{ end }}
{{- end }}

{{- define "cancel-bus.ownsSigningKey" -}}
{{- if and .Values.signingKey.enabled (not .Values.signingKey.existingSecret) }}true{{ end }}
{{- end }}

{{- define "cancel-bus.ownsRedisPassword" -}}
{{- if .Values.redis.inChart.enabled }}true
{{- else if and (not .Values.redis.auth.existingSecret) .Values.redis.auth.password }}true
{{- end }}
{{- end }}

{{/* CANCEL_BUS_REDIS_PASSWORD's Secret reference ({name, key}), empty without a password. */}}
{{- define "cancel-bus.redisPasswordRef" -}}
{{- $auth := .Values.redis.auth }}
{{- if and $auth.existingSecret (not .Values.redis.inChart.enabled) }}
{{- toJson (dict "name" $auth.existingSecret "key" $auth.passwordKey) }}
{{- else if include "cancel-bus.ownsRedisPassword" . }}
{{- toJson (dict "name" (include "cancel-bus.secretName" .) "key" "redis-password") }}
{{- end }}
{{- end }}

{{/* Whether the sentinels have credentials of their own (CANCEL_BUS_REDIS_SENTINEL_*). */}}
{{- define "cancel-bus.sentinelAuth" -}}
{{- $r := .Values.redis }}
{{- if and (eq $r.mode "sentinel") (not $r.inChart.enabled) (not $r.urlFromSecret.name) $r.sentinel.auth.existingSecret }}true{{ end }}
{{- end }}

{{- define "cancel-bus.needsSecret" -}}
{{- if or (include "cancel-bus.ownsTokens" .) (include "cancel-bus.ownsSigningKey" .) (include "cancel-bus.ownsRedisPassword" .) }}true{{ end }}
{{- end }}

{{/*
A value kept across upgrades: the one in the live Secret if there is one (`lookup`; empty under
`helm template`, so GitOps renderers should use existing Secrets), else a new random one.
*/}}
{{- define "cancel-bus.keep" -}}
{{- $ctx := index . 0 }}{{ $key := index . 1 }}{{ $length := index . 2 }}
{{- $live := lookup "v1" "Secret" $ctx.Release.Namespace (include "cancel-bus.secretName" $ctx) }}
{{- if and $live $live.data (hasKey $live.data $key) }}
{{- index $live.data $key | b64dec }}
{{- else }}
{{- randAlphaNum $length }}
{{- end }}
{{- end }}

{{/*
Shutdown budget, in seconds: the preStop sleep, then the drain (CANCEL_BUS_DRAIN_TIMEOUT; it also
ends the node's follow streams at once), then uvicorn's graceful shutdown of the connections still
open (fixed at 5 s by node/cli.py). terminationGracePeriodSeconds must exceed it by a margin: when
the drain timeout ends, the runs still running are cancelled and recorded and the node leaves the
cluster (each step bounded at 5 s by the library; well under a second with a healthy Redis).
Default margin 10 s, at least 5 s, or the kubelet SIGKILLs a node mid-drain.
*/}}
{{- define "cancel-bus.uvicornShutdownSeconds" -}}5{{- end }}

{{- define "cancel-bus.shutdownBudget" -}}
{{- $drain := .Values.config.drainTimeout | float64 | ceil | int }}
{{- add (int .Values.preStopSleepSeconds) $drain (include "cancel-bus.uvicornShutdownSeconds" . | int) }}
{{- end }}

{{- define "cancel-bus.terminationGracePeriodSeconds" -}}
{{- $budget := include "cancel-bus.shutdownBudget" . | int }}
{{- if kindIs "invalid" .Values.terminationGracePeriodSeconds }}
{{- add $budget 10 }}
{{- else if lt (int .Values.terminationGracePeriodSeconds) (add $budget 5) }}
{{- fail (printf "terminationGracePeriodSeconds (%v) must be at least preStopSleepSeconds + drainTimeout + 5 (uvicorn's shutdown) + 5 (margin) = %d, or the kubelet kills nodes mid-drain" .Values.terminationGracePeriodSeconds (add $budget 5)) }}
{{- else }}
{{- .Values.terminationGracePeriodSeconds | int }}
{{- end }}
{{- end }}

{{/* Checks across values that the JSON schema cannot express. */}}
{{- define "cancel-bus.validate" -}}
{{- $startup := mul (int .Values.probes.startup.periodSeconds) (int .Values.probes.startup.failureThreshold) }}
{{- $needed := add (.Values.config.leaseTtl | float64 | ceil | int) 10 }}
{{- if lt (int $startup) (int $needed) }}
{{- fail (printf "probes.startup.periodSeconds x failureThreshold (%d s) must be at least config.leaseTtl + 10 (%d s): a restarted container waits out its previous lease" $startup $needed) }}
{{- end }}
{{- if and .Values.signingKey.verificationKeysSecretKey (not .Values.signingKey.existingSecret) }}
{{- fail "signingKey.verificationKeysSecretKey needs signingKey.existingSecret (the keys live in it)" }}
{{- end }}
{{- if and .Values.autoscaling.enabled (lt (int .Values.autoscaling.maxReplicas) (int .Values.autoscaling.minReplicas)) }}
{{- fail "autoscaling.maxReplicas must be at least autoscaling.minReplicas" }}
{{- end }}
{{- if and .Values.metrics.serviceMonitor.enabled .Values.config.metricsRequireToken (not .Values.metrics.serviceMonitor.tokenSecret.name) (not (and (include "cancel-bus.ownsTokens" .) .Values.auth.generateOpsToken)) }}
{{- fail "config.metricsRequireToken with a ServiceMonitor needs an ops token: set metrics.serviceMonitor.tokenSecret.name or keep auth.generateOpsToken" }}
{{- end }}
{{- if and (include "cancel-bus.ownsTokens" .) (not .Values.auth.tokens) (not .Values.auth.generateOpsToken) }}
{{- fail "no API tokens: set auth.tokens, auth.existingSecret or auth.generateOpsToken (a node without tokens refuses to start on the pod's address)" }}
{{- end }}
{{- end }}

{{/* host:port list -> the ports, for the NetworkPolicy. */}}
{{- define "cancel-bus.redisPorts" -}}
{{- $ports := list }}
{{- if .Values.networkPolicy.redisPorts }}
{{- $ports = .Values.networkPolicy.redisPorts }}
{{- else if .Values.redis.inChart.enabled }}
{{- $ports = list 6379 }}
{{- else if eq .Values.redis.mode "sentinel" }}
{{- range .Values.redis.sentinel.addresses }}{{ $ports = append $ports (splitList ":" . | last | int) }}{{ end }}
{{- $ports = append $ports 6379 }}
{{- else if eq .Values.redis.mode "cluster" }}
{{- range .Values.redis.cluster.addresses }}{{ $ports = append $ports (splitList ":" . | last | int) }}{{ end }}
{{- else if .Values.redis.urlFromSecret.name }}
{{- $ports = list 6379 }}
{{- else }}
{{- $host := (urlParse .Values.redis.url).host }}
{{- $ports = list (ternary (splitList ":" $host | last | int) 6379 (contains ":" $host)) }}
{{- end }}
{{- toJson ($ports | uniq) }}
{{- end }}

{{/* Where the Redis TLS Secret is mounted. */}}
{{- define "cancel-bus.redisTlsDir" -}}/etc/cancel-bus/redis-tls{{- end }}

{{/* The query string carrying the TLS options (redis-py connection arguments). */}}
{{- define "cancel-bus.redisQuery" -}}
{{- $params := list }}
{{- with .Values.redis.tls }}
{{- if .enabled }}
{{- $dir := include "cancel-bus.redisTlsDir" $ }}
{{- if and .existingSecret .caKey }}{{ $params = append $params (printf "ssl_ca_certs=%s/%s" $dir .caKey) }}{{ end }}
{{- if and .existingSecret .certKey }}{{ $params = append $params (printf "ssl_certfile=%s/%s" $dir .certKey) }}{{ end }}
{{- if and .existingSecret .keyKey }}{{ $params = append $params (printf "ssl_keyfile=%s/%s" $dir .keyKey) }}{{ end }}
{{- $params = append $params (printf "ssl_cert_reqs=%s" .certReqs) }}
{{- if not .checkHostname }}{{ $params = append $params "ssl_check_hostname=false" }}{{ end }}
{{- end }}
{{- end }}
{{- join "&" $params }}
{{- end }}

{{/*
CANCEL_BUS_REDIS_URL, without credentials: the node puts CANCEL_BUS_REDIS_USERNAME and
CANCEL_BUS_REDIS_PASSWORD into it, URL-encoded (node/settings.py redis_connection_url). Forms
(cancel_bus/_redis.py): redis[s]://host:port/db, redis[s]+sentinel://h:p,h:p/<master>/<db>,
redis[s]+cluster://h:p,h:p. The sentinels' own credentials come the same way, through
CANCEL_BUS_REDIS_SENTINEL_USERNAME and CANCEL_BUS_REDIS_SENTINEL_PASSWORD.
*/}}
{{- define "cancel-bus.redisUrl" -}}
{{- $scheme := ternary "rediss" "redis" .Values.redis.tls.enabled }}
{{- $query := include "cancel-bus.redisQuery" . }}
{{- $url := "" }}
{{- if .Values.redis.inChart.enabled }}
{{- $url = printf "redis://%s-redis:6379/0" (include "cancel-bus.fullname" .) }}
{{- else if eq .Values.redis.mode "sentinel" }}
{{- $s := .Values.redis.sentinel }}
{{- $url = printf "%s+sentinel://%s/%s/%d" $scheme (join "," $s.addresses) $s.masterName (int $s.db) }}
{{- else if eq .Values.redis.mode "cluster" }}
{{- $url = printf "%s+cluster://%s" $scheme (join "," .Values.redis.cluster.addresses) }}
{{- else }}
{{- $u := urlParse .Values.redis.url }}
{{- $url = printf "%s://%s%s" $u.scheme $u.host $u.path }}
{{- $query = join "&" (compact (list $u.query $query)) }}
{{- end }}
{{- if $query }}{{ $url = printf "%s?%s" $url $query }}{{ end }}
{{- $url }}
{{- end }}

{{/* preStop: the kubelet's own sleep from 1.30 on (no binary needed), else `sleep` in the image. */}}
{{- define "cancel-bus.preStop" -}}
{{- if semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version }}
sleep:
  seconds: {{ int .Values.preStopSleepSeconds }}
{{- else }}
exec:
  command: ["sleep", "{{ int .Values.preStopSleepSeconds }}"]
{{- end }}
{{- end }}
