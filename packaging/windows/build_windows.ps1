# Build the Windows bundle of Diffuse Studio and its Inno Setup installer. Run on Windows 10/11
# x64 in a "Developer PowerShell for VS 2022" (MSVC with OpenMP), with Python 3.11 (python.org,
# on PATH), CMake and Inno Setup 6 (iscc.exe on PATH):
#
#   powershell -ExecutionPolicy Bypass -File packaging\windows\build_windows.ps1 [-Work build\bundle]
param([string]$Work = "")
$ErrorActionPreference = "Stop"
$root = (Resolve-Path "$PSScriptRoot\..\..").Path
if (-not $Work) { $Work = "$root\build\bundle" }
New-Item -ItemType Directory -Force -Path $Work | Out-Null
$Work = (Resolve-Path $Work).Path

function Run { & $args[0] $args[1..($args.Length - 1)]; if ($LASTEXITCODE) { throw "failed: $args" } }

if (-not (Test-Path "$Work\venv\Scripts\python.exe")) { Run python -m venv "$Work\venv" }
$py = "$Work\venv\Scripts\python.exe"
$version = & $py -c "import tomllib;print(tomllib.load(open(r'$root\pyproject.toml','rb'))['project']['version'])"

# The engine, built PORTABLE: x86-64 with AVX2/FMA/F16C, not this machine's CPU.
Remove-Item "$Work\wheels\diffuse-*.whl" -ErrorAction SilentlyContinue
$env:CMAKE_ARGS = "-DDIFFUSE_PORTABLE=ON"
Run $py -m pip wheel -q --no-deps -w "$Work\wheels" -C "build-dir=$Work\cmake" $root
$wheel = (Get-ChildItem "$Work\wheels\diffuse-*.whl" | Select-Object -First 1).FullName
Run $py -m pip install -q --force-reinstall --no-deps $wheel
Run $py -m pip install -q "$wheel[studio,hub]" -r "$root\packaging\requirements.txt"

Run $py "$root\packaging\make_icon.py" "$Work\icon.png" 256
$env:DIFFUSE_ICON = "$Work\icon.png"
Run "$Work\venv\Scripts\pyinstaller.exe" --noconfirm --log-level WARN --distpath "$Work\dist" `
    --workpath "$Work\pyinstaller" "$root\packaging\diffuse-studio.spec"

Run iscc /Q "/DAppVersion=$version" "/DDistDir=$Work\dist\diffuse-studio" "/DOutputDir=$Work" `
    "$PSScriptRoot\diffuse-studio.iss"
Get-ChildItem "$Work\diffuse-studio-*-setup.exe"
