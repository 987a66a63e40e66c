{{/* The chart's name, or nameOverride. */}}
{{- define "mirror-maker.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's objects' name: RELEASE-mirror-maker, or fullnameOverride. */}}
{{- define "mirror-maker.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "mirror-maker.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mirror-maker.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mirror-maker.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "mirror-maker.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The Secret the pods read: the user's existingSecret or the chart's own. */}}
{{- define "mirror-maker.secretName" -}}
{{- default (printf "%s-secrets" (include "mirror-maker.fullname" .)) .Values.existingSecret -}}
{{- end -}}

{{/*
"true" when a property key holds a secret, by the mirror's own rule
(mirror_maker::settings::client::is_secret_key; tests/helm.rs checks the two agree).
*/}}
{{- define "mirror-maker.isSecretKey" -}}
{{- $k := lower . -}}
{{- $word := false -}}
{{- range list "password" "secret" "token" "jaas" "credential" "private" "key.pem" -}}
{{- if contains . $k }}{{ $word = true }}{{ end -}}
{{- end -}}
{{- if or $word (hasSuffix ".key" $k) (hasSuffix "oauthbearer.config" $k) -}}true{{- end -}}
{{- end -}}

{{/*
One TOML line per librdkafka property: quoted keys (so "ssl.key.location" stays one key and
two files can be joined), every value a string. Helm reads YAML numbers as floats: whole
numbers are written without an exponent.
*/}}
{{- define "mirror-maker.toml" -}}
{{- range $k, $v := . }}
{{- $s := toString $v -}}
{{- if and (kindIs "float64" $v) (eq $v (float64 (int64 $v))) -}}
{{- $s = toString (int64 $v) -}}
{{- end }}
{{ toJson (toString $k) }} = {{ toJson $s }}
{{- end -}}
{{- end -}}

{{/* ceil(timeoutMs / 1000) + closeSeconds + marginSeconds */}}
{{- define "mirror-maker.terminationGracePeriodSeconds" -}}
{{- $s := .Values.shutdown -}}
{{- add (div (add (int64 $s.timeoutMs) 999) 1000) (int64 $s.closeSeconds) (int64 $s.marginSeconds) -}}
{{- end -}}
