# slm-train's native addon is built by CMake (CMakeLists.txt, through cmake-js), because libtorch
# ships a CMake package (find_package(Torch)) and no gyp description. This file gives `node-gyp
# rebuild` -- run by tools that assume gyp (prebuild tooling, electron-rebuild) -- the same build:
# its only target runs scripts/install-native.mjs, which uses a matching prebuilt binary if one is
# present and otherwise builds build/Release/slm_train.node with CMake.
{
  "targets": [
    {
      "target_name": "slm_train",
      "type": "none",
      "actions": [
        {
          "action_name": "cmake_build",
          "inputs": ["<(module_root_dir)/CMakeLists.txt"],
          "outputs": ["<(module_root_dir)/build/Release/slm_train.node"],
          "action": ["node", "<(module_root_dir)/scripts/install-native.mjs", "--force"]
        }
      ]
    }
  ]
}
