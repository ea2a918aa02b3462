; Inno Setup 6 script: installs the PyInstaller folder of Diffuse Studio for the current user
; (no administrator rights), with a Start menu entry and an uninstaller. Built by
; build_windows.ps1, which passes AppVersion, DistDir and OutputDir.
#ifndef AppVersion
  #define AppVersion "0.1.0"
#endif

[Setup]
AppId={{6E2B7C1A-5D3F-4B8E-9A61-D1FF05E5A7C2}
AppName=Diffuse Studio
AppVersion={#AppVersion}
AppPublisher=diffuse
DefaultDirName={autopf}\Diffuse Studio
DefaultGroupName=Diffuse Studio
DisableProgramGroupPage=yes
PrivilegesRequired=lowest
PrivilegesRequiredOverridesAllowed=dialog
ArchitecturesAllowed=x64compatible
ArchitecturesInstallIn64BitMode=x64compatible
OutputDir={#OutputDir}
OutputBaseFilename=diffuse-studio-{#AppVersion}-windows-x64-setup
Compression=lzma2/max
SolidCompression=yes
WizardStyle=modern
UninstallDisplayIcon={app}\diffuse-studio.exe

[Tasks]
Name: "desktopicon"; Description: "{cm:CreateDesktopIcon}"; GroupDescription: "{cm:AdditionalIcons}"; Flags: unchecked

[Files]
Source: "{#DistDir}\*"; DestDir: "{app}"; Flags: ignoreversion recursesubdirs createallsubdirs

[Icons]
Name: "{group}\Diffuse Studio"; Filename: "{app}\diffuse-studio.exe"
Name: "{group}\Uninstall Diffuse Studio"; Filename: "{uninstallexe}"
Name: "{autodesktop}\Diffuse Studio"; Filename: "{app}\diffuse-studio.exe"; Tasks: desktopicon

[Run]
Filename: "{app}\diffuse-studio.exe"; Description: "{cm:LaunchProgram,Diffuse Studio}"; Flags: nowait postinstall skipifsilent
